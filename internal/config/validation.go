package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	utilvalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/kube-proxy/config/v1alpha1"
	netutils "k8s.io/utils/net"
)

// ipvsSchedulers are the IPVS schedulers of the Linux kernel (ip_vs_*
// modules). Upstream stopped validating the name and fails later, when the
// kernel refuses the service; kproxy rejects a typo up front. "" means rr.
var ipvsSchedulers = []string{"", "rr", "wrr", "lc", "wlc", "fo", "ovf", "lblc", "lblcr", "dh", "sh", "mh", "sed", "nq", "twos"}

// logFormats are the formats upstream kube-proxy registers (text, and json
// through k8s.io/component-base/logs/json/register).
var logFormats = []string{"text", "json"}

// Validate checks c as upstream kube-proxy v1.37 does (on Linux) and returns
// every problem found, joined with errors.Join. Each joined error is a
// *field.Error whose Field is the v1alpha1 JSON path (e.g.
// "iptables.masqueradeBit", "nodePortAddresses[1]"), so callers can use
// errors.As. c should be defaulted first.
func Validate(c *v1alpha1.KubeProxyConfiguration) error {
	errs := validateFields(c)
	if len(errs) == 0 {
		return nil
	}
	joined := make([]error, len(errs))
	for i, e := range errs {
		joined[i] = e
	}
	return errors.Join(joined...)
}

func validateFields(c *v1alpha1.KubeProxyConfiguration) field.ErrorList {
	var errs field.ErrorList

	// Validation must not log: warnings about GA or deprecated gates are
	// emitted once, by NewFeatureGate.
	gates, err := newFeatureGate(c.FeatureGates, logr.Discard())
	if err != nil {
		errs = append(errs, field.Invalid(field.NewPath("featureGates"), c.FeatureGates, err.Error()))
		gates = newKnownFeatureGate()
	}

	errs = append(errs, validateMode(c, gates)...)
	errs = append(errs, validateMasqueradeBit(c.IPTables.MasqueradeBit, field.NewPath("iptables", "masqueradeBit"))...)
	switch EffectiveMode(c) {
	case ModeIPTables:
		errs = append(errs, validateSyncPeriods(c.IPTables.SyncPeriod.Duration, c.IPTables.MinSyncPeriod.Duration, field.NewPath("iptables"))...)
	case ModeIPVS:
		errs = append(errs, validateSyncPeriods(c.IPVS.SyncPeriod.Duration, c.IPVS.MinSyncPeriod.Duration, field.NewPath("ipvs"))...)
		errs = append(errs, validateIPVS(&c.IPVS, field.NewPath("ipvs"))...)
	case ModeNFTables:
		errs = append(errs, validateSyncPeriods(c.NFTables.SyncPeriod.Duration, c.NFTables.MinSyncPeriod.Duration, field.NewPath("nftables"))...)
		errs = append(errs, validateMasqueradeBit(c.NFTables.MasqueradeBit, field.NewPath("nftables", "masqueradeBit"))...)
	}
	errs = append(errs, validateConntrack(&c.Conntrack, field.NewPath("conntrack"))...)

	if c.OOMScoreAdj != nil && (*c.OOMScoreAdj < -1000 || *c.OOMScoreAdj > 1000) {
		errs = append(errs, field.Invalid(field.NewPath("oomScoreAdj"), *c.OOMScoreAdj, "must be within the range [-1000, 1000]"))
	}
	if c.ClientConnection.Burst < 0 {
		errs = append(errs, field.Invalid(field.NewPath("clientConnection", "burst"), c.ClientConnection.Burst, "must be greater than or equal to 0"))
	}
	if c.ConfigSyncPeriod.Duration <= 0 {
		errs = append(errs, field.Invalid(field.NewPath("configSyncPeriod"), c.ConfigSyncPeriod.Duration.String(), "must be greater than 0"))
	}

	if netutils.ParseIPSloppy(c.BindAddress) == nil {
		errs = append(errs, field.Invalid(field.NewPath("bindAddress"), c.BindAddress, "must be a valid IP address (kube-proxy uses it as the node IP, it binds no socket to it)"))
	}
	// An empty server address disables that server (--healthz-port=0,
	// --metrics-bind-address="").
	if c.HealthzBindAddress != "" {
		errs = append(errs, validateHostPort(c.HealthzBindAddress, field.NewPath("healthzBindAddress"))...)
	}
	if c.MetricsBindAddress != "" {
		errs = append(errs, validateHostPort(c.MetricsBindAddress, field.NewPath("metricsBindAddress"))...)
	}

	if c.HostnameOverride != "" {
		// The name is used trimmed and lower-cased (upstream's
		// GetHostname), so "Node-A " names node-a; what is left must
		// still be a Node name.
		name := NormalizeHostname(c.HostnameOverride)
		if name == "" {
			errs = append(errs, field.Invalid(field.NewPath("hostnameOverride"), c.HostnameOverride, "must not be blank"))
		}
		for _, msg := range utilvalidation.IsDNS1123Subdomain(name) {
			if name == "" {
				break
			}
			errs = append(errs, field.Invalid(field.NewPath("hostnameOverride"), c.HostnameOverride, "must be a valid Node name: "+msg))
		}
	}

	errs = append(errs, validateNodePortAddresses(c.NodePortAddresses, field.NewPath("nodePortAddresses"))...)
	errs = append(errs, validateShowHiddenMetricsVersion(c.ShowHiddenMetricsForVersion, field.NewPath("showHiddenMetricsForVersion"))...)
	errs = append(errs, validateDetectLocal(c)...)
	errs = append(errs, validateLogging(&c.Logging, gates, field.NewPath("logging"))...)
	return errs
}

func validateMode(c *v1alpha1.KubeProxyConfiguration, gates featuregate.FeatureGate) field.ErrorList {
	fld := field.NewPath("mode")
	switch string(c.Mode) {
	case "", ModeIPTables, ModeNFTables:
		return nil
	case ModeIPVS:
		if !gates.Enabled(KubeProxyIPVS) {
			return field.ErrorList{field.Forbidden(fld, fmt.Sprintf("ipvs mode is disabled by the %s feature gate", KubeProxyIPVS))}
		}
		return nil
	}
	return field.ErrorList{field.Invalid(fld, string(c.Mode),
		"must be iptables, ipvs, nftables or blank (blank means the default proxy mode, currently iptables)")}
}

func validateMasqueradeBit(bit *int32, fld *field.Path) field.ErrorList {
	if bit != nil && (*bit < 0 || *bit > 31) {
		return field.ErrorList{field.Invalid(fld, *bit, "must be within the range [0, 31]")}
	}
	return nil
}

func validateSyncPeriods(syncPeriod, minSyncPeriod time.Duration, fld *field.Path) field.ErrorList {
	var errs field.ErrorList
	if syncPeriod <= 0 {
		errs = append(errs, field.Invalid(fld.Child("syncPeriod"), syncPeriod.String(), "must be greater than 0"))
	}
	if minSyncPeriod < 0 {
		errs = append(errs, field.Invalid(fld.Child("minSyncPeriod"), minSyncPeriod.String(), "must be greater than or equal to 0"))
	}
	if minSyncPeriod > syncPeriod {
		errs = append(errs, field.Invalid(fld.Child("syncPeriod"), syncPeriod.String(),
			fmt.Sprintf("must be greater than or equal to %s", fld.Child("minSyncPeriod"))))
	}
	return errs
}

func validateIPVS(c *v1alpha1.KubeProxyIPVSConfiguration, fld *field.Path) field.ErrorList {
	var errs field.ErrorList
	for name, d := range map[string]time.Duration{"tcpTimeout": c.TCPTimeout.Duration, "tcpFinTimeout": c.TCPFinTimeout.Duration, "udpTimeout": c.UDPTimeout.Duration} {
		if d < 0 {
			errs = append(errs, field.Invalid(fld.Child(name), d.String(), "must be greater than or equal to 0"))
		}
	}
	if !sets.New(ipvsSchedulers...).Has(c.Scheduler) {
		errs = append(errs, field.NotSupported(fld.Child("scheduler"), c.Scheduler, ipvsSchedulers))
	}
	for i, cidr := range c.ExcludeCIDRs {
		if _, _, err := netutils.ParseCIDRSloppy(cidr); err != nil {
			errs = append(errs, field.Invalid(fld.Child("excludeCIDRs").Index(i), cidr, "must be a valid CIDR"))
		}
	}
	return sortByField(errs)
}

func validateConntrack(c *v1alpha1.KubeProxyConntrackConfiguration, fld *field.Path) field.ErrorList {
	var errs field.ErrorList
	if c.MaxPerCore != nil && *c.MaxPerCore < 0 {
		errs = append(errs, field.Invalid(fld.Child("maxPerCore"), *c.MaxPerCore, "must be greater than or equal to 0"))
	}
	if c.Min != nil && *c.Min < 0 {
		errs = append(errs, field.Invalid(fld.Child("min"), *c.Min, "must be greater than or equal to 0"))
	}
	durations := []struct {
		name string
		d    time.Duration
	}{
		{"tcpEstablishedTimeout", derefDuration(c.TCPEstablishedTimeout)},
		{"tcpCloseWaitTimeout", derefDuration(c.TCPCloseWaitTimeout)},
		{"udpTimeout", c.UDPTimeout.Duration},
		{"udpStreamTimeout", c.UDPStreamTimeout.Duration},
	}
	for _, d := range durations {
		if d.d < 0 {
			errs = append(errs, field.Invalid(fld.Child(d.name), d.d.String(), "must be greater than or equal to 0"))
		}
	}
	return errs
}

func validateHostPort(input string, fld *field.Path) field.ErrorList {
	host, port, err := net.SplitHostPort(input)
	if err != nil {
		return field.ErrorList{field.Invalid(fld, input, "must be IP:port")}
	}
	var errs field.ErrorList
	if netutils.ParseIPSloppy(host) == nil {
		errs = append(errs, field.Invalid(fld, input, fmt.Sprintf("%q must be a valid IP", host)))
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		errs = append(errs, field.Invalid(fld, input, fmt.Sprintf("%q must be a valid port (1-65535)", port)))
	}
	return errs
}

// validateNodePortAddresses follows v1.37: CIDRs and the keywords primary,
// localhost and all, in any combination, each at most once. Keywords are
// case-sensitive.
func validateNodePortAddresses(addrs []string, fld *field.Path) field.ErrorList {
	var errs field.ErrorList
	seen := sets.New[string]()
	for i, a := range addrs {
		switch a {
		case NodePortAddressesPrimary, NodePortAddressesLocalhost, NodePortAddressesAll:
		default:
			if _, _, err := netutils.ParseCIDRSloppy(a); err != nil {
				errs = append(errs, field.Invalid(fld.Index(i), a, "must be a valid CIDR or one of the keywords 'primary', 'localhost', 'all'"))
				continue
			}
		}
		if seen.Has(a) {
			errs = append(errs, field.Duplicate(fld.Index(i), a))
		}
		seen.Insert(a)
	}
	return errs
}

// validateShowHiddenMetricsVersion allows only the previous minor release,
// as component-base's metrics.ValidateShowHiddenMetricsVersion does.
func validateShowHiddenMetricsVersion(v string, fld *field.Path) field.ErrorList {
	if v == "" {
		return nil
	}
	cur := version.MustParse(KubernetesVersion)
	want := fmt.Sprintf("%d.%d", cur.Major(), cur.Minor()-1)
	got, err := version.ParseMajorMinor(v)
	if err != nil {
		return field.ErrorList{field.Invalid(fld, v, "must be in the format <major>.<minor>, e.g. "+want)}
	}
	if got.Major() != cur.Major() || got.Minor()+1 != cur.Minor() {
		return field.ErrorList{field.Invalid(fld, v, "only the previous minor version is allowed: "+want)}
	}
	return nil
}

func validateDetectLocal(c *v1alpha1.KubeProxyConfiguration) field.ErrorList {
	modes := []string{LocalModeClusterCIDR, LocalModeNodeCIDR, LocalModeBridgeInterface, LocalModeInterfaceNamePrefix, ""}
	switch string(c.DetectLocalMode) {
	case LocalModeBridgeInterface:
		if c.DetectLocal.BridgeInterface == "" {
			return field.ErrorList{field.Invalid(field.NewPath("detectLocal", "bridgeInterface"), "", "must not be empty when detectLocalMode is BridgeInterface")}
		}
	case LocalModeInterfaceNamePrefix:
		if c.DetectLocal.InterfaceNamePrefix == "" {
			return field.ErrorList{field.Invalid(field.NewPath("detectLocal", "interfaceNamePrefix"), "", "must not be empty when detectLocalMode is InterfaceNamePrefix")}
		}
	case LocalModeClusterCIDR, "":
		// "" is ClusterCIDR after defaulting. An empty clusterCIDR is
		// allowed: kube-proxy then treats no traffic as local (see
		// Warnings).
		if c.ClusterCIDR != "" {
			return validateClusterCIDR(c.ClusterCIDR, field.NewPath("clusterCIDR"))
		}
	case LocalModeNodeCIDR:
	default:
		return field.ErrorList{field.NotSupported(field.NewPath("detectLocalMode"), string(c.DetectLocalMode), modes)}
	}
	return nil
}

// validateClusterCIDR accepts one CIDR or a dual-stack pair, comma separated
// without blanks (upstream splits on "," only).
func validateClusterCIDR(s string, fld *field.Path) field.ErrorList {
	cidrs := strings.Split(s, ",")
	if len(cidrs) > 2 {
		return field.ErrorList{field.Invalid(fld, s, "must be a single CIDR or a dual-stack pair of CIDRs (e.g. 10.100.0.0/16,fde4:8dba:82e1::/48)")}
	}
	for _, cidr := range cidrs {
		if _, _, err := netutils.ParseCIDRSloppy(cidr); err != nil {
			return field.ErrorList{field.Invalid(fld, s, fmt.Sprintf("%q is not a valid CIDR (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)", cidr))}
		}
	}
	if len(cidrs) == 2 {
		if dual, err := netutils.IsDualStackCIDRStrings(cidrs); err != nil || !dual {
			return field.ErrorList{field.Invalid(fld, s, "two CIDRs must be one IPv4 and one IPv6 (a dual-stack pair)")}
		}
	}
	return nil
}

// validateLogging mirrors logsapi.Validate, with the json format accepted as
// upstream kube-proxy registers it.
func validateLogging(c *logsapi.LoggingConfiguration, gates featuregate.FeatureGate, fld *field.Path) field.ErrorList {
	var errs field.ErrorList
	if c.FlushFrequency.Duration.Duration <= 0 {
		errs = append(errs, field.Invalid(fld.Child("flushFrequency"), c.FlushFrequency.Duration.Duration.String(), "must be greater than 0"))
	}
	format := c.Format
	if format == "" {
		format = "text"
	}
	if !sets.New(logFormats...).Has(format) {
		errs = append(errs, field.NotSupported(fld.Child("format"), c.Format, logFormats))
	} else if format == "json" && !gates.Enabled(logsapi.LoggingBetaOptions) {
		errs = append(errs, field.Forbidden(fld.Child("format"), fmt.Sprintf("log format json is disabled, see the %s feature gate", logsapi.LoggingBetaOptions)))
	}
	if c.Verbosity > math.MaxInt32 {
		errs = append(errs, field.Invalid(fld.Child("verbosity"), c.Verbosity, fmt.Sprintf("must be <= %d", math.MaxInt32)))
	}
	vmodule := fld.Child("vmodule")
	if len(c.VModule) > 0 && format != "text" {
		errs = append(errs, field.Forbidden(vmodule, "only supported for the text log format"))
	}
	for i, item := range c.VModule {
		if item.FilePattern == "" {
			errs = append(errs, field.Required(vmodule.Index(i).Child("filePattern"), "file pattern must not be empty"))
		}
		if strings.ContainsAny(item.FilePattern, "=,") {
			errs = append(errs, field.Invalid(vmodule.Index(i).Child("filePattern"), item.FilePattern, "file pattern must not contain '=' or ','"))
		}
		if item.Verbosity > math.MaxInt32 {
			errs = append(errs, field.Invalid(vmodule.Index(i).Child("verbosity"), item.Verbosity, fmt.Sprintf("must be <= %d", math.MaxInt32)))
		}
	}
	alpha := gates.Enabled(logsapi.LoggingAlphaOptions)
	for name, o := range map[string]logsapi.OutputRoutingOptions{"text": c.Options.Text.OutputRoutingOptions, "json": c.Options.JSON.OutputRoutingOptions} {
		if alpha {
			continue
		}
		if o.SplitStream {
			errs = append(errs, field.Forbidden(fld.Child("options", name, "splitStream"), fmt.Sprintf("feature gate %s is disabled", logsapi.LoggingAlphaOptions)))
		}
		if o.InfoBufferSize.Value() != 0 {
			errs = append(errs, field.Forbidden(fld.Child("options", name, "infoBufferSize"), fmt.Sprintf("feature gate %s is disabled", logsapi.LoggingAlphaOptions)))
		}
	}
	return sortByField(errs)
}

func derefDuration(d *metav1.Duration) time.Duration {
	if d == nil {
		return 0
	}
	return d.Duration
}

// sortByField orders errors built from map iteration, so that messages are
// stable from run to run.
func sortByField(errs field.ErrorList) field.ErrorList {
	sort.SliceStable(errs, func(i, j int) bool { return errs[i].Field < errs[j].Field })
	return errs
}
