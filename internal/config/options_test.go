package config

// Addresses: 10.244.0.0/16 / fd00:1::/64 stand for pod ranges, 192.0.2.0/24
// (TEST-NET-1) for node addresses. No socket is opened.

import (
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"
	"k8s.io/kube-proxy/config/v1alpha1"
)

func noEnv(string) string { return "" }

func env(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

// newFlagSet registers o's flags and klog's, like cmd/kproxy does.
func newFlagSet(o *Options) *pflag.FlagSet {
	fs := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	fs.SetOutput(io.Discard) // deprecation notices
	o.AddFlags(fs)
	AddKlogFlags(fs)
	return fs
}

// complete parses args, optionally with a config file, and completes.
func complete(t *testing.T, file string, args ...string) (*Options, error) {
	t.Helper()
	o := NewOptions()
	fs := newFlagSet(o)
	if file != "" {
		args = append(args, "--config="+writeFile(t, file))
	}
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parsing %v: %v", args, err)
	}
	return o, o.Complete(fs, noEnv)
}

func mustComplete(t *testing.T, file string, args ...string) *Options {
	t.Helper()
	o, err := complete(t, file, args...)
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	return o
}

// The names and defaults of kube-proxy v1.37's Linux flags.
func TestFlagNamesAndDefaults(t *testing.T) {
	want := map[string]string{
		"config": "", "write-config-to": "", "cleanup": "false", "init-only": "false",
		"kubeconfig": "", "master": "", "kube-api-content-type": "application/vnd.kubernetes.protobuf",
		"kube-api-burst": "10", "kube-api-qps": "5", "hostname-override": "", "feature-gates": "",
		"bind-address": "0.0.0.0", "healthz-bind-address": "0.0.0.0:10256", "metrics-bind-address": "127.0.0.1:10249",
		"bind-address-hard-fail": "false", "profiling": "false", "show-hidden-metrics-for-version": "",
		"proxy-mode": "", "iptables-masquerade-bit": "14", "masquerade-all": "false",
		"iptables-localhost-nodeports": "true", "iptables-sync-period": "30s", "iptables-min-sync-period": "1s",
		"ipvs-sync-period": "30s", "ipvs-min-sync-period": "1s", "ipvs-scheduler": "", "ipvs-exclude-cidrs": "[]",
		"ipvs-strict-arp": "false", "ipvs-tcp-timeout": "0s", "ipvs-tcpfin-timeout": "0s", "ipvs-udp-timeout": "0s",
		"detect-local-mode": "", "pod-bridge-interface": "", "pod-interface-name-prefix": "", "cluster-cidr": "",
		"nodeport-addresses": "[]", "oom-score-adj": "-999", "conntrack-max-per-core": "32768",
		"conntrack-min": "131072", "conntrack-tcp-timeout-established": "24h0m0s",
		"conntrack-tcp-timeout-close-wait": "1h0m0s", "conntrack-tcp-be-liberal": "false",
		"conntrack-udp-timeout": "0s", "conntrack-udp-timeout-stream": "0s", "config-sync-period": "15m0s",
		"healthz-port": "10256", "metrics-port": "10249", "logging-format": "text", "log-flush-frequency": "5s",
		"v": "0", "vmodule": "",
	}
	fs := newFlagSet(NewOptions())
	for name, def := range want {
		f := fs.Lookup(name)
		if f == nil {
			t.Errorf("flag --%s is missing", name)
			continue
		}
		if f.DefValue != def {
			t.Errorf("--%s default = %q, want %q", name, f.DefValue, def)
		}
	}
	for _, name := range []string{"healthz-port", "metrics-port"} {
		if fs.Lookup(name).Deprecated == "" {
			t.Errorf("--%s should be deprecated", name)
		}
	}
	if !strings.Contains(fs.Lookup("feature-gates").Usage, "KubeProxyNFTablesLocalhostNodePorts=true|false (ALPHA - default=false)") {
		t.Errorf("--feature-gates help does not list the known gates:\n%s", fs.Lookup("feature-gates").Usage)
	}
}

func TestFlagValueChecks(t *testing.T) {
	for _, args := range [][]string{
		{"--bind-address=192.0.2.1:80"},
		{"--healthz-bind-address=nope:1"},
		{"--metrics-bind-address=127.0.0.1:http"},
		{"--feature-gates=Foo=maybe"},
	} {
		fs := newFlagSet(NewOptions())
		if err := fs.Parse(args); err == nil {
			t.Errorf("%v: parsed, want an error", args)
		}
	}
}

// Without --config, flags build the configuration (upstream's "legacy
// flag-based e2e configuration").
func TestFlagsOnly(t *testing.T) {
	o := mustComplete(t, "",
		"--kubeconfig=/var/lib/kube-proxy/kubeconfig.conf", "--master=https://192.0.2.10:6443",
		"--cluster-cidr=10.244.0.0/16,fd00:1::/64", "--proxy-mode=ipvs", "--hostname-override= Node1 ",
		"--ipvs-scheduler=rr", "--ipvs-strict-arp=true", "--nodeport-addresses=primary,192.0.2.0/24",
		"--feature-gates=KubeProxyNFTablesLocalhostNodePorts=true", "--conntrack-max-per-core=0", "--oom-score-adj=-500",
		"--healthz-bind-address=192.0.2.1", "--metrics-bind-address=", "--cleanup", "--init-only")
	want := NewOptions().Config
	want.ClientConnection.Kubeconfig = "/var/lib/kube-proxy/kubeconfig.conf"
	want.ClusterCIDR = "10.244.0.0/16,fd00:1::/64"
	want.Mode = "ipvs"
	want.HostnameOverride = "node1"
	want.IPVS.Scheduler = "rr"
	want.IPVS.StrictARP = true
	want.IPVS.MinSyncPeriod.Duration = time.Second // upstream's flag path: the 1s default lands in ipvs
	want.NodePortAddresses = []string{"primary", "192.0.2.0/24"}
	want.FeatureGates = map[string]bool{"KubeProxyNFTablesLocalhostNodePorts": true}
	*want.Conntrack.MaxPerCore = 0
	*want.OOMScoreAdj = -500
	want.HealthzBindAddress = "192.0.2.1:10256"
	want.MetricsBindAddress = ""
	want.DetectLocalMode = "ClusterCIDR"
	if diff := cmp.Diff(want, o.Config); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	if o.Kubeconfig != "/var/lib/kube-proxy/kubeconfig.conf" || o.Master != "https://192.0.2.10:6443" || !o.CleanupAndExit || !o.InitAndExit {
		t.Errorf("options: kubeconfig=%q master=%q cleanup=%v init=%v", o.Kubeconfig, o.Master, o.CleanupAndExit, o.InitAndExit)
	}
	if err := o.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
}

// Sync period and masquerade-all flags land in the section of the mode, as
// upstream's processV1Alpha1Flags and conversion put them.
func TestModeDependentFlags(t *testing.T) {
	cases := []struct {
		name          string
		args          []string
		sync, minSync time.Duration
		masqAll       bool
	}{
		{"iptables", []string{"--iptables-sync-period=36s", "--iptables-min-sync-period=3s", "--proxy-mode=iptables"}, 36 * time.Second, 3 * time.Second, false},
		{"default mode", []string{"--iptables-sync-period=36s", "--masquerade-all"}, 36 * time.Second, time.Second, true},
		{"iptables ignores ipvs flags", []string{"--iptables-sync-period=36s", "--iptables-min-sync-period=3s", "--ipvs-sync-period=16s", "--ipvs-min-sync-period=7s", "--proxy-mode=iptables"}, 36 * time.Second, 3 * time.Second, false},
		{"ipvs ignores iptables flags", []string{"--iptables-sync-period=36s", "--iptables-min-sync-period=3s", "--ipvs-sync-period=16s", "--ipvs-min-sync-period=7s", "--proxy-mode=ipvs", "--masquerade-all"}, 16 * time.Second, 7 * time.Second, true},
		{"ipvs defaults", []string{"--proxy-mode=ipvs"}, 30 * time.Second, time.Second, false},
		{"nftables takes the iptables flags", []string{"--iptables-sync-period=36s", "--iptables-min-sync-period=3s", "--ipvs-sync-period=16s", "--proxy-mode=nftables", "--masquerade-all"}, 36 * time.Second, 3 * time.Second, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := mustComplete(t, "", tc.args...).Config
			sync, minSync := SyncPeriods(c)
			if sync != tc.sync || minSync != tc.minSync {
				t.Errorf("SyncPeriods = %v, %v; want %v, %v", sync, minSync, tc.sync, tc.minSync)
			}
			if MasqueradeAll(c) != tc.masqAll {
				t.Errorf("MasqueradeAll = %v, want %v", MasqueradeAll(c), tc.masqAll)
			}
			if EffectiveMode(c) == ModeNFTables && c.IPTables.MasqueradeAll {
				t.Error("nftables mode: --masquerade-all went to the iptables section")
			}
		})
	}
}

// With --config the file replaces the flag-built configuration; only
// --hostname-override and the logging flags win over it.
func TestConfigFilePrecedence(t *testing.T) {
	file := header + `mode: nftables
clusterCIDR: 10.244.0.0/16
clientConnection:
  kubeconfig: /etc/kube-proxy/kubeconfig
hostnameOverride: from-file
logging:
  verbosity: 2
  vmodule:
  - filePattern: proxier.go
    verbosity: 6
`
	o := mustComplete(t, file,
		"--proxy-mode=ipvs", "--cluster-cidr=10.0.0.0/8", "--kubeconfig=/flag/kubeconfig",
		"--iptables-sync-period=5s", "--conntrack-min=1", "--feature-gates=NoSuchGate=true", "--masquerade-all",
		"--healthz-port=0", "--hostname-override=From-Flag", "-v=4", "--vmodule=runner.go=9",
		"--logging-format=json", "--master=https://192.0.2.10:6443", "--cleanup")
	c := o.Config

	// The file wins...
	if c.Mode != "nftables" || c.ClusterCIDR != "10.244.0.0/16" || o.Kubeconfig != "/etc/kube-proxy/kubeconfig" {
		t.Errorf("file values lost: mode=%q clusterCIDR=%q kubeconfig=%q", c.Mode, c.ClusterCIDR, o.Kubeconfig)
	}
	// ...and what it leaves out is defaulted, not taken from the flags.
	if c.NFTables.SyncPeriod.Duration != 30*time.Second || *c.Conntrack.Min != 131072 || len(c.FeatureGates) != 0 ||
		MasqueradeAll(c) || c.HealthzBindAddress != "0.0.0.0:10256" {
		t.Errorf("flags leaked into a --config configuration: %+v", c)
	}
	// The exceptions.
	if c.HostnameOverride != "from-flag" {
		t.Errorf("hostnameOverride = %q, want the lower-cased flag value", c.HostnameOverride)
	}
	wantLogging := []logsapi.VModuleItem{{FilePattern: "runner.go", Verbosity: 9}, {FilePattern: "proxier.go", Verbosity: 6}}
	if c.Logging.Verbosity != 4 || !slices.Equal(c.Logging.VModule, wantLogging) || c.Logging.Format != "json" {
		t.Errorf("logging = %+v, want -v=4, flag vmodule first, format json", c.Logging)
	}
	if o.Master != "https://192.0.2.10:6443" || !o.CleanupAndExit {
		t.Errorf("non-config flags lost: master=%q cleanup=%v", o.Master, o.CleanupAndExit)
	}
	// The file's own values hold where no flag says otherwise.
	o = mustComplete(t, file)
	if o.Config.HostnameOverride != "from-file" || o.Config.Logging.Verbosity != 2 || len(o.Config.Logging.VModule) != 1 {
		t.Errorf("file logging/hostname lost: %q %+v", o.Config.HostnameOverride, o.Config.Logging)
	}
}

func TestHostnameOverride(t *testing.T) {
	if _, err := complete(t, "", "--hostname-override=   "); err == nil || !strings.Contains(err.Error(), "hostname-override") {
		t.Errorf("blank --hostname-override: error = %v", err)
	}
	if o := mustComplete(t, ""); o.Config.HostnameOverride != "" {
		t.Errorf("no flag: hostnameOverride = %q", o.Config.HostnameOverride)
	}
}

func TestDeprecatedPortFlags(t *testing.T) {
	cases := []struct {
		name                     string
		args                     []string
		wantHealthz, wantMetrics string
	}{
		{"defaults", nil, "0.0.0.0:10256", "127.0.0.1:10249"},
		{"ports on bare IPs", []string{"--healthz-bind-address=192.0.2.1", "--healthz-port=1234", "--metrics-bind-address=::1", "--metrics-port=4321"}, "192.0.2.1:1234", "[::1]:4321"},
		{"address port wins", []string{"--healthz-bind-address=192.0.2.1:80", "--healthz-port=1234"}, "192.0.2.1:80", "127.0.0.1:10249"},
		{"port 0 disables", []string{"--healthz-port=0", "--metrics-port=0"}, "", ""},
		{"not with --write-config-to", []string{"--healthz-port=0", "--write-config-to=/dev/null"}, "0.0.0.0:10256", "127.0.0.1:10249"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := mustComplete(t, "", tc.args...).Config
			if c.HealthzBindAddress != tc.wantHealthz || c.MetricsBindAddress != tc.wantMetrics {
				t.Errorf("healthz, metrics = %q, %q; want %q, %q", c.HealthzBindAddress, c.MetricsBindAddress, tc.wantHealthz, tc.wantMetrics)
			}
		})
	}
}

func TestIPTablesModeEnv(t *testing.T) {
	for _, tc := range []struct {
		value   string
		wantErr bool
	}{{"", false}, {"legacy", false}, {"nft", false}, {"auto", true}, {"NFT", true}, {"nftables", true}} {
		o := NewOptions()
		fs := newFlagSet(o)
		err := o.Complete(fs, env(map[string]string{"IPTABLES_MODE": tc.value}))
		if tc.wantErr {
			if err == nil || !strings.Contains(err.Error(), `"legacy", "nft"`) {
				t.Errorf("IPTABLES_MODE=%q: error = %v, want one naming the allowed values", tc.value, err)
			}
			continue
		}
		if err != nil || o.IPTablesMode != tc.value {
			t.Errorf("IPTABLES_MODE=%q: err=%v IPTablesMode=%q", tc.value, err, o.IPTablesMode)
		}
	}
}

func TestValidateNeedsComplete(t *testing.T) {
	if err := NewOptions().Validate(); err == nil {
		t.Error("Validate before Complete succeeded")
	}
}

func TestWarnings(t *testing.T) {
	cases := []struct {
		name string
		file string
		args []string
		env  map[string]string
		want []string // substrings, each must match one warning
		not  []string // substrings no warning may contain
	}{
		{
			name: "ipvs flags outside ipvs mode",
			args: []string{"--proxy-mode=nftables", "--ipvs-scheduler=rr", "--ipvs-sync-period=5s", "--iptables-sync-period=5s"},
			want: []string{"--ipvs-scheduler is set but --proxy-mode is nftables; it has no effect", "--ipvs-sync-period is set but --proxy-mode is nftables"},
			not:  []string{"--iptables-sync-period"},
		},
		{
			name: "iptables sync flags in ipvs mode",
			args: []string{"--proxy-mode=ipvs", "--iptables-sync-period=5s", "--iptables-masquerade-bit=3", "--ipvs-scheduler=rr"},
			want: []string{"--iptables-sync-period is set but --proxy-mode is ipvs", "ipvs proxy mode is deprecated"},
			not:  []string{"--iptables-masquerade-bit", "--ipvs-scheduler"},
		},
		{
			name: "nftables has its own masquerade bit and no localhost nodeports",
			args: []string{"--proxy-mode=nftables", "--iptables-masquerade-bit=3", "--iptables-localhost-nodeports=false"},
			want: []string{"--iptables-masquerade-bit is set but --proxy-mode is nftables", "--iptables-localhost-nodeports is set but --proxy-mode is nftables"},
		},
		{
			name: "detect-local companions",
			args: []string{"--proxy-mode=iptables", "--detect-local-mode=NodeCIDR", "--pod-bridge-interface=cbr0", "--pod-interface-name-prefix=veth", "--cluster-cidr=10.244.0.0/16"},
			want: []string{"--pod-bridge-interface is set but --detect-local-mode is NodeCIDR", "--pod-interface-name-prefix is set", "--cluster-cidr is set but --detect-local-mode is NodeCIDR"},
		},
		{
			name: "matching flags give no warning",
			args: []string{"--proxy-mode=iptables", "--iptables-localhost-nodeports=false", "--detect-local-mode=BridgeInterface", "--pod-bridge-interface=cbr0"},
			not:  []string{"has no effect", "ignored", "not set"},
		},
		{
			name: "defaulted mode and empty cluster CIDR",
			want: []string{"proxy mode is not set, using iptables", "clusterCIDR is empty"},
		},
		{
			name: "flags ignored with --config",
			file: header + "mode: iptables\nclusterCIDR: 10.244.0.0/16\n",
			args: []string{"--proxy-mode=ipvs", "--cluster-cidr=10.0.0.0/8", "--hostname-override=node1", "-v=3"},
			want: []string{"--proxy-mode is ignored because --config", "--cluster-cidr is ignored because --config"},
			not:  []string{"--hostname-override", "-v", "--config is ignored"},
		},
		{
			name: "config file fields of other modes and unknown fields",
			file: header + "mode: nftables\nclusterCIDR: 10.244.0.0/16\nipvs:\n  scheduler: rr\n  strictARP: true\niptables:\n  masqueradeAll: true\nfoo: bar\n",
			want: []string{"ipvs.scheduler is set but mode is nftables", "ipvs.strictARP is set", "iptables.masqueradeAll is set but mode is nftables", `field "foo" is unknown`},
		},
		{
			name: "IPTABLES_MODE in nftables mode and json logs",
			args: []string{"--proxy-mode=nftables", "--cluster-cidr=10.244.0.0/16", "--logging-format=json"},
			env:  map[string]string{"IPTABLES_MODE": "legacy"},
			want: []string{"IPTABLES_MODE=legacy only selects the iptables backend"},
			not:  []string{"json"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			fs := newFlagSet(o)
			args := tc.args
			if tc.file != "" {
				args = append(args, "--config="+writeFile(t, tc.file))
			}
			if err := fs.Parse(args); err != nil {
				t.Fatal(err)
			}
			if err := o.Complete(fs, env(tc.env)); err != nil {
				t.Fatal(err)
			}
			got := o.Warnings()
			for _, w := range tc.want {
				if !slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, w) }) {
					t.Errorf("no warning contains %q; got:\n%s", w, strings.Join(got, "\n"))
				}
			}
			for _, n := range tc.not {
				for _, s := range got {
					if strings.Contains(s, n) {
						t.Errorf("unexpected warning %q (contains %q)", s, n)
					}
				}
			}
		})
	}
}

func TestApplyLogging(t *testing.T) {
	defer func() {
		_ = ApplyLogging(validConfig())
	}()
	c := validConfig(func(c *v1alpha1.KubeProxyConfiguration) {
		c.Logging.Verbosity = 5
	})
	if err := ApplyLogging(c); err != nil {
		t.Fatal(err)
	}
	if !klog.V(5).Enabled() || klog.V(6).Enabled() {
		t.Errorf("after ApplyLogging(v=5): V(5)=%v V(6)=%v", klog.V(5).Enabled(), klog.V(6).Enabled())
	}
	if err := ApplyLogging(validConfig()); err != nil {
		t.Fatal(err)
	}
	if klog.V(1).Enabled() {
		t.Error("after ApplyLogging(v=0): V(1) still enabled")
	}
}
