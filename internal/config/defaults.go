package config

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/kube-proxy/config/v1alpha1"
	netutils "k8s.io/utils/net"
	"k8s.io/utils/ptr"
)

// Proxy modes accepted on Linux.
const (
	ModeIPTables = "iptables"
	ModeIPVS     = "ipvs"
	ModeNFTables = "nftables"
)

// Values of detectLocalMode.
const (
	LocalModeClusterCIDR         = "ClusterCIDR"
	LocalModeNodeCIDR            = "NodeCIDR"
	LocalModeBridgeInterface     = "BridgeInterface"
	LocalModeInterfaceNamePrefix = "InterfaceNamePrefix"
)

// Keywords allowed in nodePortAddresses besides CIDRs (v1.37: any mix of
// keywords and CIDRs).
const (
	NodePortAddressesPrimary   = "primary"
	NodePortAddressesLocalhost = "localhost"
	NodePortAddressesAll       = "all"
)

// Values of the IPTABLES_MODE environment variable.
const (
	IPTablesModeAuto   = ""
	IPTablesModeLegacy = "legacy"
	IPTablesModeNFT    = "nft"
)

// Upstream constants that the defaults are built from.
const (
	// APIVersion and Kind that a config file must declare.
	APIVersion = "kubeproxy.config.k8s.io/v1alpha1"
	Kind       = "KubeProxyConfiguration"

	// KubernetesVersion is the kube-proxy release whose behaviour kproxy
	// follows; it decides which feature gates exist and which
	// showHiddenMetricsForVersion is allowed.
	KubernetesVersion = "1.37"

	// ProxyHealthzPort and ProxyStatusPort are upstream's pkg/cluster/ports.
	ProxyHealthzPort = 10256
	ProxyStatusPort  = 10249

	// DefaultOOMScoreAdj is upstream's qos.KubeProxyOOMScoreAdj.
	DefaultOOMScoreAdj = -999

	defaultMasqueradeBit    = 14
	defaultSyncPeriod       = 30 * time.Second
	defaultMinSyncPeriod    = 1 * time.Second
	defaultConfigSyncPeriod = 15 * time.Minute
	defaultContentType      = "application/vnd.kubernetes.protobuf"
	defaultQPS              = 5.0
	defaultBurst            = 10
	defaultConntrackPerCore = 32 * 1024
	defaultConntrackMin     = 128 * 1024
	defaultTCPEstablished   = 24 * time.Hour
	// A CLOSE_WAIT entry that expires too early makes the local FIN leave
	// un-SNATed; an hour matches typical server timeouts (upstream #32551).
	defaultTCPCloseWait = 1 * time.Hour
)

// Defaults fills unset fields the way upstream's v1alpha1 SetDefaults does,
// plus the Linux platform default of detectLocalMode (ClusterCIDR). The mode
// is left as is: "" means iptables, see EffectiveMode. Conntrack UDP timeouts
// and the IPVS minSyncPeriod/timeouts keep 0, which upstream reads as "leave
// the kernel value alone" / "no minimum".
func Defaults(c *v1alpha1.KubeProxyConfiguration) {
	if c.APIVersion == "" {
		c.APIVersion = APIVersion
	}
	if c.Kind == "" {
		c.Kind = Kind
	}
	if c.BindAddress == "" {
		c.BindAddress = "0.0.0.0"
	}
	healthzHost, metricsHost := defaultServerHosts(c.BindAddress)
	if c.HealthzBindAddress == "" {
		c.HealthzBindAddress = net.JoinHostPort(healthzHost, strconv.Itoa(ProxyHealthzPort))
	} else {
		c.HealthzBindAddress = appendPortIfNeeded(c.HealthzBindAddress, ProxyHealthzPort)
	}
	if c.MetricsBindAddress == "" {
		c.MetricsBindAddress = net.JoinHostPort(metricsHost, strconv.Itoa(ProxyStatusPort))
	} else {
		c.MetricsBindAddress = appendPortIfNeeded(c.MetricsBindAddress, ProxyStatusPort)
	}
	if c.OOMScoreAdj == nil {
		c.OOMScoreAdj = ptr.To[int32](DefaultOOMScoreAdj)
	}

	setDuration(&c.IPTables.SyncPeriod, defaultSyncPeriod)
	setDuration(&c.IPTables.MinSyncPeriod, defaultMinSyncPeriod)
	if c.IPTables.LocalhostNodePorts == nil {
		c.IPTables.LocalhostNodePorts = ptr.To(true)
	}
	if c.IPTables.MasqueradeBit == nil {
		c.IPTables.MasqueradeBit = ptr.To[int32](defaultMasqueradeBit)
	}
	setDuration(&c.IPVS.SyncPeriod, defaultSyncPeriod)
	setDuration(&c.NFTables.SyncPeriod, defaultSyncPeriod)
	setDuration(&c.NFTables.MinSyncPeriod, defaultMinSyncPeriod)
	if c.NFTables.MasqueradeBit == nil {
		c.NFTables.MasqueradeBit = ptr.To[int32](defaultMasqueradeBit)
	}

	if c.Conntrack.MaxPerCore == nil {
		c.Conntrack.MaxPerCore = ptr.To[int32](defaultConntrackPerCore)
	}
	if c.Conntrack.Min == nil {
		c.Conntrack.Min = ptr.To[int32](defaultConntrackMin)
	}
	if c.Conntrack.TCPEstablishedTimeout == nil {
		c.Conntrack.TCPEstablishedTimeout = &metav1.Duration{Duration: defaultTCPEstablished}
	}
	if c.Conntrack.TCPCloseWaitTimeout == nil {
		c.Conntrack.TCPCloseWaitTimeout = &metav1.Duration{Duration: defaultTCPCloseWait}
	}

	setDuration(&c.ConfigSyncPeriod, defaultConfigSyncPeriod)
	if c.ClientConnection.ContentType == "" {
		c.ClientConnection.ContentType = defaultContentType
	}
	if c.ClientConnection.QPS == 0 {
		c.ClientConnection.QPS = defaultQPS
	}
	if c.ClientConnection.Burst == 0 {
		c.ClientConnection.Burst = defaultBurst
	}
	if c.FeatureGates == nil {
		c.FeatureGates = map[string]bool{}
	}
	logsapi.SetRecommendedLoggingConfiguration(&c.Logging)
	applyPlatformDefaults(c)
}

// applyPlatformDefaults is upstream's Linux platformApplyDefaults minus the
// mode: it runs for both the flag and the file path.
func applyPlatformDefaults(c *v1alpha1.KubeProxyConfiguration) {
	if c.DetectLocalMode == "" {
		c.DetectLocalMode = LocalModeClusterCIDR
	}
}

// NormalizeHostname is a node name as upstream's GetHostname uses it:
// surrounding white space removed, lower-cased.
func NormalizeHostname(s string) string {
	return strings.ToLower(strings.TrimSpace(s))
}

// EffectiveMode is the proxy mode kproxy runs: the configured one, or
// iptables when it is empty (the Linux default in v1.37).
func EffectiveMode(c *v1alpha1.KubeProxyConfiguration) string {
	if c.Mode == "" {
		return ModeIPTables
	}
	return string(c.Mode)
}

// SyncPeriods returns the sync period and minimum sync period of the
// effective mode, picked from that mode's section as upstream's conversion
// does.
func SyncPeriods(c *v1alpha1.KubeProxyConfiguration) (syncPeriod, minSyncPeriod time.Duration) {
	switch EffectiveMode(c) {
	case ModeIPVS:
		return c.IPVS.SyncPeriod.Duration, c.IPVS.MinSyncPeriod.Duration
	case ModeNFTables:
		return c.NFTables.SyncPeriod.Duration, c.NFTables.MinSyncPeriod.Duration
	default:
		return c.IPTables.SyncPeriod.Duration, c.IPTables.MinSyncPeriod.Duration
	}
}

// MasqueradeAll returns masqueradeAll of the effective mode: the nftables
// section in nftables mode, the iptables section otherwise (ipvs included).
func MasqueradeAll(c *v1alpha1.KubeProxyConfiguration) bool {
	if EffectiveMode(c) == ModeNFTables {
		return c.NFTables.MasqueradeAll
	}
	return c.IPTables.MasqueradeAll
}

// MasqueradeBit returns the fwmark bit of the effective mode: nftables mode
// has its own field, iptables and ipvs share iptables.masqueradeBit.
func MasqueradeBit(c *v1alpha1.KubeProxyConfiguration) int32 {
	if EffectiveMode(c) == ModeNFTables {
		return ptr.Deref(c.NFTables.MasqueradeBit, defaultMasqueradeBit)
	}
	return ptr.Deref(c.IPTables.MasqueradeBit, defaultMasqueradeBit)
}

func setDuration(d *metav1.Duration, def time.Duration) {
	if d.Duration == 0 {
		d.Duration = def
	}
}

// defaultServerHosts picks the wildcard (healthz) and loopback (metrics)
// hosts of bindAddress's family.
func defaultServerHosts(bindAddress string) (healthz, metrics string) {
	if ip := netutils.ParseIPSloppy(bindAddress); ip != nil && ip.To4() == nil {
		return "::", "::1"
	}
	return "0.0.0.0", "127.0.0.1"
}

// appendPortIfNeeded adds port to a bare IP, bracketing IPv6; anything else
// (already host:port, or garbage for Validate to report) is returned as is.
func appendPortIfNeeded(addr string, port int) string {
	if _, _, err := net.SplitHostPort(addr); err == nil {
		return addr
	}
	ip := netutils.ParseIPSloppy(addr)
	if ip == nil {
		return addr
	}
	if ip.To4() != nil {
		return fmt.Sprintf("%s:%d", addr, port)
	}
	return fmt.Sprintf("[%s]:%d", addr, port)
}
