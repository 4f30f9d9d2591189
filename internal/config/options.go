package config

import (
	goflag "flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation/field"
	cliflag "k8s.io/component-base/cli/flag"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"
	"k8s.io/kube-proxy/config/v1alpha1"
)

// Options holds the command line state of kproxy and, after Complete, the
// effective configuration. See the package documentation for how --config
// and the flags combine.
type Options struct {
	// Config is the effective configuration once Complete has returned.
	// Before that it holds the flag-bound values, which start at the
	// upstream defaults (so that --help shows them).
	Config *v1alpha1.KubeProxyConfiguration

	// ConfigFile is --config.
	ConfigFile string
	// WriteConfigTo is --write-config-to: write the effective configuration
	// there (WriteConfigFile) and exit.
	WriteConfigTo string
	// CleanupAndExit is --cleanup: remove the rules of every mode and exit.
	CleanupAndExit bool
	// InitAndExit is --init-only: do the privileged initialisation (sysctls,
	// conntrack limits) and exit.
	InitAndExit bool
	// Master is --master: overrides the API server URL of the kubeconfig.
	Master string
	// Kubeconfig is the effective kubeconfig path, set by Complete to
	// Config.ClientConnection.Kubeconfig (--kubeconfig, or the file's
	// clientConnection.kubeconfig when --config is given).
	Kubeconfig string
	// IPTablesMode is the IPTABLES_MODE environment variable: "" (detect),
	// "legacy" or "nft". Set by Complete.
	IPTablesMode string

	// hostnameOverride is the raw --hostname-override, which wins over the
	// config file.
	hostnameOverride string
	// Deprecated --healthz-port and --metrics-port.
	healthzPort int32
	metricsPort int32
	// Flags whose target field depends on the mode, resolved in Complete as
	// upstream's processV1Alpha1Flags and conversion do.
	iptablesSyncPeriod    time.Duration
	iptablesMinSyncPeriod time.Duration
	ipvsSyncPeriod        time.Duration
	ipvsMinSyncPeriod     time.Duration
	masqueradeAll         bool

	fs        *pflag.FlagSet
	completed bool
	// fileWarnings are problems of the config file that upstream tolerates.
	fileWarnings []string
}

// NewOptions returns Options whose Config holds the upstream defaults.
func NewOptions() *Options {
	c := &v1alpha1.KubeProxyConfiguration{}
	Defaults(c)
	// detectLocalMode is applied as a platform default in Complete; leaving
	// it empty here keeps --help's default blank, as upstream.
	c.DetectLocalMode = ""
	sync, minSync := c.IPTables.SyncPeriod.Duration, c.IPTables.MinSyncPeriod.Duration
	return &Options{
		Config:                c,
		healthzPort:           ProxyHealthzPort,
		metricsPort:           ProxyStatusPort,
		iptablesSyncPeriod:    sync,
		iptablesMinSyncPeriod: minSync,
		ipvsSyncPeriod:        sync,
		ipvsMinSyncPeriod:     minSync,
	}
}

// Flags bound to KubeProxyConfiguration fields: with --config they are
// ignored, as upstream ignores them.
var configFieldFlags = map[string]bool{
	"proxy-mode": true, "kubeconfig": true, "kube-api-content-type": true, "kube-api-burst": true,
	"kube-api-qps": true, "feature-gates": true, "bind-address": true, "healthz-bind-address": true,
	"metrics-bind-address": true, "bind-address-hard-fail": true, "profiling": true,
	"show-hidden-metrics-for-version": true, "iptables-masquerade-bit": true, "masquerade-all": true,
	"iptables-localhost-nodeports": true, "iptables-sync-period": true, "iptables-min-sync-period": true,
	"ipvs-sync-period": true, "ipvs-min-sync-period": true, "ipvs-scheduler": true,
	"ipvs-exclude-cidrs": true, "ipvs-strict-arp": true, "ipvs-tcp-timeout": true,
	"ipvs-tcpfin-timeout": true, "ipvs-udp-timeout": true, "detect-local-mode": true,
	"pod-bridge-interface": true, "pod-interface-name-prefix": true, "cluster-cidr": true,
	"nodeport-addresses": true, "oom-score-adj": true, "conntrack-max-per-core": true,
	"conntrack-min": true, "conntrack-tcp-timeout-established": true,
	"conntrack-tcp-timeout-close-wait": true, "conntrack-tcp-be-liberal": true,
	"conntrack-udp-timeout": true, "conntrack-udp-timeout-stream": true, "config-sync-period": true,
	"healthz-port": true, "metrics-port": true,
}

// AddFlags registers every Linux flag of kube-proxy v1.37 except -v and
// --vmodule (see AddKlogFlags), with upstream's names, defaults and meaning.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	c := o.Config
	const ignored = " This parameter is ignored if a config file is specified by --config."

	fs.StringVar(&o.ConfigFile, "config", o.ConfigFile, "The path to the configuration file.")
	fs.StringVar(&o.WriteConfigTo, "write-config-to", o.WriteConfigTo, "If set, write the default configuration values to this file and exit.")
	fs.BoolVar(&o.CleanupAndExit, "cleanup", o.CleanupAndExit, "If true cleanup iptables and ipvs rules and exit.")
	fs.BoolVar(&o.InitAndExit, "init-only", o.InitAndExit, "If true, perform any initialization steps that must be done with full root privileges, and then exit. After doing this, you can run kube-proxy again with only the CAP_NET_ADMIN capability.")

	fs.Var(cliflag.NewMapStringBool(&c.FeatureGates), "feature-gates", "A set of key=value pairs that describe feature gates for alpha/experimental features. Options are:\n"+
		strings.Join(KnownFeatureGates(), "\n")+"\n"+strings.TrimSpace(ignored))

	fs.StringVar(&c.ClientConnection.Kubeconfig, "kubeconfig", c.ClientConnection.Kubeconfig, "Path to kubeconfig file with authorization information (the master location can be overridden by the master flag).")
	fs.StringVar(&o.Master, "master", o.Master, "The address of the Kubernetes API server (overrides any value in kubeconfig)")
	fs.StringVar(&c.ClientConnection.ContentType, "kube-api-content-type", c.ClientConnection.ContentType, "Content type of requests sent to apiserver.")
	fs.Int32Var(&c.ClientConnection.Burst, "kube-api-burst", c.ClientConnection.Burst, "Burst to use while talking with kubernetes apiserver")
	fs.Float32Var(&c.ClientConnection.QPS, "kube-api-qps", c.ClientConnection.QPS, "QPS to use while talking with kubernetes apiserver")

	fs.StringVar(&o.hostnameOverride, "hostname-override", o.hostnameOverride, "If non-empty, will be used as the name of the Node that kube-proxy is running on. If unset, the node name is assumed to be the same as the node's hostname.")
	fs.Var(ipValue{&c.BindAddress}, "bind-address", "Overrides kube-proxy's idea of what its node's primary IP is. Note that the name is a historical artifact, and kube-proxy does not actually bind any sockets to this IP."+ignored)
	fs.Var(ipPortValue{&c.HealthzBindAddress}, "healthz-bind-address", "The IP address and port for the health check server to serve on, defaulting to \"0.0.0.0:10256\"."+ignored)
	fs.Var(ipPortValue{&c.MetricsBindAddress}, "metrics-bind-address", "The IP address and port for the metrics server to serve on, defaulting to \"127.0.0.1:10249\". (Set to \"0.0.0.0:10249\" / \"[::]:10249\" to bind on all interfaces.) Set empty to disable."+ignored)
	fs.BoolVar(&c.BindAddressHardFail, "bind-address-hard-fail", c.BindAddressHardFail, "If true kube-proxy will treat failure to bind to a port as fatal and exit")
	fs.BoolVar(&c.EnableProfiling, "profiling", c.EnableProfiling, "If true enables profiling via web interface on /debug/pprof handler."+ignored)
	fs.StringVar(&c.ShowHiddenMetricsForVersion, "show-hidden-metrics-for-version", c.ShowHiddenMetricsForVersion,
		"The previous version for which you want to show hidden metrics. Only the previous minor version is meaningful, other values will not be allowed. "+
			"The format is <major>.<minor>, e.g.: '1.16'. The purpose of this format is make sure you have the opportunity to notice if the next release hides additional metrics, "+
			"rather than being surprised when they are permanently removed in the release after that."+ignored)
	fs.Var(stringValue[v1alpha1.ProxyMode]{&c.Mode, "ProxyMode"}, "proxy-mode", "Which proxy mode to use: on Linux this can be 'iptables' (default), 'ipvs', or 'nftables'."+ignored)

	fs.Int32Var(c.IPTables.MasqueradeBit, "iptables-masquerade-bit", *c.IPTables.MasqueradeBit, "If using the iptables or ipvs proxy mode, the bit of the fwmark space to mark packets requiring SNAT with.  Must be within the range [0, 31].")
	fs.BoolVar(&o.masqueradeAll, "masquerade-all", o.masqueradeAll, "SNAT all traffic sent via Service cluster IPs. This may be required with some CNI plugins. Only supported on Linux.")
	fs.BoolVar(c.IPTables.LocalhostNodePorts, "iptables-localhost-nodeports", *c.IPTables.LocalhostNodePorts, "If false, kube-proxy will disable the legacy behavior of allowing NodePort services to be accessed via localhost. (Applies only to iptables mode and IPv4; localhost NodePorts are never allowed with other proxy modes or with IPv6.)")
	fs.DurationVar(&o.iptablesSyncPeriod, "iptables-sync-period", o.iptablesSyncPeriod, "An interval (e.g. '5s', '1m', '2h22m') indicating how frequently various re-synchronizing and cleanup operations are performed. Must be greater than 0.")
	fs.DurationVar(&o.iptablesMinSyncPeriod, "iptables-min-sync-period", o.iptablesMinSyncPeriod, "The minimum period between iptables rule resyncs (e.g. '5s', '1m', '2h22m'). A value of 0 means every Service or EndpointSlice change will result in an immediate iptables resync.")

	fs.DurationVar(&o.ipvsSyncPeriod, "ipvs-sync-period", o.ipvsSyncPeriod, "An interval (e.g. '5s', '1m', '2h22m') indicating how frequently various re-synchronizing and cleanup operations are performed. Must be greater than 0.")
	fs.DurationVar(&o.ipvsMinSyncPeriod, "ipvs-min-sync-period", o.ipvsMinSyncPeriod, "The minimum period between IPVS rule resyncs (e.g. '5s', '1m', '2h22m'). A value of 0 means every Service or EndpointSlice change will result in an immediate IPVS resync.")
	fs.StringVar(&c.IPVS.Scheduler, "ipvs-scheduler", c.IPVS.Scheduler, "The ipvs scheduler type when proxy mode is ipvs")
	fs.StringSliceVar(&c.IPVS.ExcludeCIDRs, "ipvs-exclude-cidrs", c.IPVS.ExcludeCIDRs, "A comma-separated list of CIDRs which the ipvs proxier should not touch when cleaning up IPVS rules.")
	fs.BoolVar(&c.IPVS.StrictARP, "ipvs-strict-arp", c.IPVS.StrictARP, "Enable strict ARP by setting arp_ignore to 1 and arp_announce to 2")
	fs.DurationVar(&c.IPVS.TCPTimeout.Duration, "ipvs-tcp-timeout", c.IPVS.TCPTimeout.Duration, "The timeout for idle IPVS TCP connections, 0 to leave as-is. (e.g. '5s', '1m', '2h22m').")
	fs.DurationVar(&c.IPVS.TCPFinTimeout.Duration, "ipvs-tcpfin-timeout", c.IPVS.TCPFinTimeout.Duration, "The timeout for IPVS TCP connections after receiving a FIN packet, 0 to leave as-is. (e.g. '5s', '1m', '2h22m').")
	fs.DurationVar(&c.IPVS.UDPTimeout.Duration, "ipvs-udp-timeout", c.IPVS.UDPTimeout.Duration, "The timeout for IPVS UDP packets, 0 to leave as-is. (e.g. '5s', '1m', '2h22m').")

	fs.Var(stringValue[v1alpha1.LocalMode]{&c.DetectLocalMode, "LocalMode"}, "detect-local-mode", "Mode to use to detect local traffic."+ignored)
	fs.StringVar(&c.DetectLocal.BridgeInterface, "pod-bridge-interface", c.DetectLocal.BridgeInterface, "A bridge interface name. When --detect-local-mode is set to BridgeInterface, kube-proxy will consider traffic to be local if it originates from this bridge.")
	fs.StringVar(&c.DetectLocal.InterfaceNamePrefix, "pod-interface-name-prefix", c.DetectLocal.InterfaceNamePrefix, "An interface name prefix. When --detect-local-mode is set to InterfaceNamePrefix, kube-proxy will consider traffic to be local if it originates from any interface whose name begins with this prefix.")
	fs.StringVar(&c.ClusterCIDR, "cluster-cidr", c.ClusterCIDR, "The CIDR range of the pods in the cluster. (For dual-stack clusters, this can be a comma-separated dual-stack pair of CIDR ranges.). When --detect-local-mode is set to ClusterCIDR, kube-proxy will consider traffic to be local if its source IP is in this range. (Otherwise it is not used.)"+ignored)

	fs.StringSliceVar(&c.NodePortAddresses, "nodeport-addresses", c.NodePortAddresses,
		"A list of CIDR ranges that contain valid node IPs. The list may also contain any of the keywords 'primary', 'localhost', and 'all', in any combination with each other and with CIDRs. "+
			"Connections to NodePort services will only be accepted on node IPs in one of the indicated ranges. 'primary' resolves to the node's primary IP(s) according to the Node object, "+
			"'localhost' to the node's loopback addresses, and 'all' to all addresses. If unset, NodePort connections are accepted on all local IPs in iptables and ipvs mode, "+
			"and on the primary IPs in nftables mode."+ignored)

	fs.Int32Var(c.OOMScoreAdj, "oom-score-adj", *c.OOMScoreAdj, "The oom-score-adj value for kube-proxy process. Values must be within the range [-1000, 1000]."+ignored)
	fs.Int32Var(c.Conntrack.MaxPerCore, "conntrack-max-per-core", *c.Conntrack.MaxPerCore, "Maximum number of NAT connections to track per CPU core (0 to leave the limit as-is and ignore conntrack-min).")
	fs.Int32Var(c.Conntrack.Min, "conntrack-min", *c.Conntrack.Min, "Minimum number of conntrack entries to allocate, regardless of conntrack-max-per-core (set conntrack-max-per-core=0 to leave the limit as-is).")
	fs.DurationVar(&c.Conntrack.TCPEstablishedTimeout.Duration, "conntrack-tcp-timeout-established", c.Conntrack.TCPEstablishedTimeout.Duration, "Idle timeout for established TCP connections (0 to leave as-is)")
	fs.DurationVar(&c.Conntrack.TCPCloseWaitTimeout.Duration, "conntrack-tcp-timeout-close-wait", c.Conntrack.TCPCloseWaitTimeout.Duration, "NAT timeout for TCP connections in the CLOSE_WAIT state")
	fs.BoolVar(&c.Conntrack.TCPBeLiberal, "conntrack-tcp-be-liberal", c.Conntrack.TCPBeLiberal, "Enable liberal mode for tracking TCP packets by setting nf_conntrack_tcp_be_liberal to 1")
	fs.DurationVar(&c.Conntrack.UDPTimeout.Duration, "conntrack-udp-timeout", c.Conntrack.UDPTimeout.Duration, "Idle timeout for UNREPLIED UDP connections (0 to leave as-is)")
	fs.DurationVar(&c.Conntrack.UDPStreamTimeout.Duration, "conntrack-udp-timeout-stream", c.Conntrack.UDPStreamTimeout.Duration, "Idle timeout for ASSURED UDP connections (0 to leave as-is)")
	fs.DurationVar(&c.ConfigSyncPeriod.Duration, "config-sync-period", c.ConfigSyncPeriod.Duration, "How often configuration from the apiserver is refreshed.  Must be greater than 0.")

	fs.Int32Var(&o.healthzPort, "healthz-port", o.healthzPort, "The port to bind the health check server. Use 0 to disable.")
	_ = fs.MarkDeprecated("healthz-port", "This flag is deprecated and will be removed in a future release. Please use --healthz-bind-address instead.")
	fs.Int32Var(&o.metricsPort, "metrics-port", o.metricsPort, "The port to bind the metrics server. Use 0 to disable.")
	_ = fs.MarkDeprecated("metrics-port", "This flag is deprecated and will be removed in a future release. Please use --metrics-bind-address instead.")

	// The logging flags of upstream's logsapi.AddFlags, minus -v and
	// --vmodule which AddKlogFlags provides.
	fs.StringVar(&c.Logging.Format, "logging-format", c.Logging.Format, "Sets the log format. Permitted formats: \"json\" (gated by LoggingBetaOptions), \"text\".")
	fs.DurationVar(&c.Logging.FlushFrequency.Duration.Duration, "log-flush-frequency", c.Logging.FlushFrequency.Duration.Duration, "Maximum number of seconds between log flushes")
	fs.BoolVar(&c.Logging.Options.Text.SplitStream, "log-text-split-stream", false, "[Alpha] In text format, write error messages to stderr and info messages to stdout. The default is to write a single stream to stdout. Enable the LoggingAlphaOptions feature gate to use this.")
	fs.Var(&c.Logging.Options.Text.InfoBufferSize, "log-text-info-buffer-size", "[Alpha] In text format with split output streams, the info messages can be buffered for a while to increase performance. The default value of zero bytes disables buffering. Enable the LoggingAlphaOptions feature gate to use this.")
	fs.BoolVar(&c.Logging.Options.JSON.SplitStream, "log-json-split-stream", false, "[Alpha] In JSON format, write error messages to stderr and info messages to stdout. Enable the LoggingAlphaOptions feature gate to use this.")
	fs.Var(&c.Logging.Options.JSON.InfoBufferSize, "log-json-info-buffer-size", "[Alpha] In JSON format with split output streams, the info messages can be buffered for a while to increase performance. Enable the LoggingAlphaOptions feature gate to use this.")
}

// loggingFlags are the logging flags that, when changed, win over the
// config file's logging section.
var loggingFlags = []string{"logging-format", "log-flush-frequency", "log-text-split-stream", "log-text-info-buffer-size", "log-json-split-stream", "log-json-info-buffer-size"}

// AddKlogFlags registers klog's -v and --vmodule on fs, the only klog
// flags upstream kube-proxy still has: it dropped --logtostderr,
// --log-dir, --add-dir-header and the other file-logging flags in v1.26,
// so an operator's command line cannot hold them. Flags already present in
// fs are left alone.
func AddKlogFlags(fs *pflag.FlagSet) {
	gfs := goflag.NewFlagSet("klog", goflag.ContinueOnError)
	klog.InitFlags(gfs)
	for _, name := range []string{"v", "vmodule"} {
		if fs.Lookup(name) == nil {
			fs.AddGoFlag(gfs.Lookup(name))
		}
	}
}

// Complete builds the effective configuration: it reads --config if given,
// applies the precedence described in the package documentation, applies the
// defaults and reads IPTABLES_MODE through getenv. fs must be the flag set
// that AddFlags (and AddKlogFlags) filled and that has been parsed.
func (o *Options) Complete(fs *pflag.FlagSet, getenv func(string) string) error {
	o.fs = fs
	o.fileWarnings = nil

	mode := getenv("IPTABLES_MODE")
	switch mode {
	case IPTablesModeAuto, IPTablesModeLegacy, IPTablesModeNFT:
		o.IPTablesMode = mode
	default:
		return fmt.Errorf("invalid IPTABLES_MODE %q: must be %q, %q or empty (detect the iptables backend)", mode, IPTablesModeLegacy, IPTablesModeNFT)
	}

	if o.ConfigFile != "" {
		c, strictErrs, err := loadConfigFile(o.ConfigFile)
		if err != nil {
			return err
		}
		for _, field := range strictErrorFields(strictErrs) {
			o.fileWarnings = append(o.fileWarnings, fmt.Sprintf("config file %s: field %q is unknown or duplicated; it was ignored (the last duplicate wins), as upstream's lenient decoding does", o.ConfigFile, field))
		}
		Defaults(c)
		if err := o.copyLoggingFlags(fs, &c.Logging); err != nil {
			return err
		}
		o.Config = c
	} else {
		o.applyFlags(fs)
		if err := o.copyLoggingFlags(fs, &o.Config.Logging); err != nil {
			return err
		}
		// The flag config was defaulted in NewOptions, before parsing, so
		// that an explicit empty --metrics-bind-address stays empty; only
		// the platform default is left to apply.
		applyPlatformDefaults(o.Config)
		if o.Config.FeatureGates == nil {
			o.Config.FeatureGates = map[string]bool{}
		}
	}

	if o.hostnameOverride != "" {
		name := strings.TrimSpace(o.hostnameOverride)
		if name == "" {
			return fmt.Errorf("empty --hostname-override is invalid")
		}
		o.Config.HostnameOverride = strings.ToLower(name)
	}
	o.Kubeconfig = o.Config.ClientConnection.Kubeconfig
	o.completed = true
	return nil
}

// applyFlags resolves the flags whose target depends on the mode, like
// upstream's processV1Alpha1Flags followed by its v1alpha1 conversion.
func (o *Options) applyFlags(fs *pflag.FlagSet) {
	c := o.Config
	if o.WriteConfigTo == "" {
		c.HealthzBindAddress = addressFromDeprecatedPort(c.HealthzBindAddress, o.healthzPort)
		c.MetricsBindAddress = addressFromDeprecatedPort(c.MetricsBindAddress, o.metricsPort)
	}

	// Upstream keeps one internal pair of sync periods, defaulted from the
	// iptables section (30s/1s), and overrides it with the iptables flags
	// unless the mode is ipvs, or with the ipvs flags in ipvs mode. The pair
	// then lands in the section of the mode.
	sync, minSync := o.iptablesSyncPeriod, o.iptablesMinSyncPeriod
	if !fs.Changed("iptables-sync-period") {
		sync = defaultSyncPeriod
	}
	if !fs.Changed("iptables-min-sync-period") {
		minSync = defaultMinSyncPeriod
	}
	if EffectiveMode(c) == ModeIPVS {
		sync, minSync = defaultSyncPeriod, defaultMinSyncPeriod
		if fs.Changed("ipvs-sync-period") {
			sync = o.ipvsSyncPeriod
		}
		if fs.Changed("ipvs-min-sync-period") {
			minSync = o.ipvsMinSyncPeriod
		}
	}
	switch EffectiveMode(c) {
	case ModeIPVS:
		c.IPVS.SyncPeriod.Duration, c.IPVS.MinSyncPeriod.Duration = sync, minSync
	case ModeNFTables:
		c.NFTables.SyncPeriod.Duration, c.NFTables.MinSyncPeriod.Duration = sync, minSync
	default:
		c.IPTables.SyncPeriod.Duration, c.IPTables.MinSyncPeriod.Duration = sync, minSync
	}

	if EffectiveMode(c) == ModeNFTables {
		c.NFTables.MasqueradeAll = o.masqueradeAll
	} else {
		c.IPTables.MasqueradeAll = o.masqueradeAll
	}
}

// addressFromDeprecatedPort applies --healthz-port/--metrics-port: port 0
// disables the server, otherwise the port is added to a bare IP.
func addressFromDeprecatedPort(addr string, port int32) string {
	if port == 0 {
		return ""
	}
	return appendPortIfNeeded(addr, int(port))
}

// copyLoggingFlags makes changed logging flags win over to: -v and the
// logging-format family replace the value, --vmodule entries go first.
func (o *Options) copyLoggingFlags(fs *pflag.FlagSet, to *logsapi.LoggingConfiguration) error {
	if f := fs.Lookup("v"); f != nil && f.Changed {
		v, err := strconv.ParseUint(f.Value.String(), 10, 32)
		if err != nil {
			return fmt.Errorf("-v=%q: %w", f.Value.String(), err)
		}
		to.Verbosity = logsapi.VerbosityLevel(v)
	}
	if f := fs.Lookup("vmodule"); f != nil && f.Changed {
		items, err := parseVModule(f.Value.String())
		if err != nil {
			return fmt.Errorf("--vmodule: %w", err)
		}
		to.VModule = append(items, to.VModule...)
	}
	if to == &o.Config.Logging {
		return nil // the flag path: the flags are bound to this struct
	}
	from := &o.Config.Logging
	for _, name := range loggingFlags {
		f := fs.Lookup(name)
		if f == nil || !f.Changed {
			continue
		}
		switch name {
		case "logging-format":
			to.Format = from.Format
		case "log-flush-frequency":
			to.FlushFrequency = from.FlushFrequency
		case "log-text-split-stream":
			to.Options.Text.SplitStream = from.Options.Text.SplitStream
		case "log-text-info-buffer-size":
			to.Options.Text.InfoBufferSize = from.Options.Text.InfoBufferSize
		case "log-json-split-stream":
			to.Options.JSON.SplitStream = from.Options.JSON.SplitStream
		case "log-json-info-buffer-size":
			to.Options.JSON.InfoBufferSize = from.Options.JSON.InfoBufferSize
		}
	}
	return nil
}

// parseVModule parses klog's "pattern=N,pattern=N" syntax.
func parseVModule(s string) ([]logsapi.VModuleItem, error) {
	var items []logsapi.VModuleItem
	for _, part := range strings.Split(s, ",") {
		if part == "" {
			continue
		}
		pattern, level, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("%q is not pattern=N", part)
		}
		v, err := strconv.ParseUint(level, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%q is not pattern=N: %w", part, err)
		}
		items = append(items, logsapi.VModuleItem{FilePattern: pattern, Verbosity: logsapi.VerbosityLevel(v)})
	}
	return items, nil
}

// Validate validates the effective configuration; see Validate.
func (o *Options) Validate() error {
	if !o.completed {
		return fmt.Errorf("config: Options.Validate called before Complete")
	}
	return Validate(o.Config)
}

// ApplyLogging makes klog follow c.Logging's verbosity and vmodule, so that
// values from a config file take effect. A format other than text (json,
// when the binary registers it as upstream's kube-proxy does) is applied
// through component-base's logs API, as upstream applies every format; that
// can happen once per process.
func ApplyLogging(c *v1alpha1.KubeProxyConfiguration) error {
	if c.Logging.Format != "" && c.Logging.Format != logsapi.DefaultLogFormat {
		// Quietly: the gates are logged once the logger is in place.
		fg, err := newFeatureGate(c.FeatureGates, logr.Discard())
		if err != nil {
			return err
		}
		return logsapi.ValidateAndApplyAsField(&c.Logging, fg, field.NewPath("logging"))
	}
	gfs := goflag.NewFlagSet("klog", goflag.ContinueOnError)
	klog.InitFlags(gfs)
	if err := gfs.Set("v", strconv.FormatUint(uint64(c.Logging.Verbosity), 10)); err != nil {
		return fmt.Errorf("setting log verbosity: %w", err)
	}
	parts := make([]string, 0, len(c.Logging.VModule))
	for _, item := range c.Logging.VModule {
		parts = append(parts, fmt.Sprintf("%s=%d", item.FilePattern, item.Verbosity))
	}
	if err := gfs.Set("vmodule", strings.Join(parts, ",")); err != nil {
		return fmt.Errorf("setting log vmodule: %w", err)
	}
	return nil
}
