package config

// Addresses used in these tests: 10.0.0.0/8 and 10.244.0.0/16 stand for pod
// ranges, fd00::/64 for an IPv6 pod range, 192.0.2.0/24 (TEST-NET-1) for node
// addresses, 127.0.0.1 / ::1 for loopback. No packet is sent anywhere.

import (
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/kube-proxy/config/v1alpha1"
	"k8s.io/utils/ptr"
)

// validConfig returns a defaulted configuration that passes Validate, edited
// by fns.
func validConfig(fns ...func(*v1alpha1.KubeProxyConfiguration)) *v1alpha1.KubeProxyConfiguration {
	c := &v1alpha1.KubeProxyConfiguration{}
	Defaults(c)
	for _, fn := range fns {
		fn(c)
	}
	return c
}

// errorFields returns the field paths of every error joined in err.
func errorFields(t *testing.T, err error) []string {
	t.Helper()
	if err == nil {
		return nil
	}
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		t.Fatalf("Validate returned %T, want a joined error", err)
	}
	var fields []string
	for _, e := range joined.Unwrap() {
		var fe *field.Error
		if !errors.As(e, &fe) {
			t.Fatalf("joined error %v is %T, not *field.Error", e, e)
		}
		fields = append(fields, fe.Field)
	}
	return fields
}

func TestValidateDefaultsAreValid(t *testing.T) {
	for _, mode := range []v1alpha1.ProxyMode{"", "iptables", "ipvs", "nftables"} {
		c := validConfig(func(c *v1alpha1.KubeProxyConfiguration) { c.Mode = mode })
		if err := Validate(c); err != nil {
			t.Errorf("mode %q: defaulted config is invalid: %v", mode, err)
		}
	}
}

func TestValidateFields(t *testing.T) {
	neg := metav1.Duration{Duration: -time.Second}
	cases := []struct {
		name   string
		edit   func(*v1alpha1.KubeProxyConfiguration)
		fields []string // nil: valid
		detail string   // substring of the message, when fields is set
	}{
		// mode
		{name: "mode nftables", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.Mode = "nftables" }},
		{name: "mode bogus", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.Mode = "userspace" }, fields: []string{"mode"}, detail: "must be iptables, ipvs, nftables or blank"},
		{name: "mode kernelspace is windows only", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.Mode = "kernelspace" }, fields: []string{"mode"}},
		{name: "ipvs disabled by gate", edit: func(c *v1alpha1.KubeProxyConfiguration) {
			c.Mode = "ipvs"
			c.FeatureGates = map[string]bool{"KubeProxyIPVS": false}
		}, fields: []string{"mode"}, detail: "KubeProxyIPVS"},

		// feature gates
		{name: "known alpha gate", edit: func(c *v1alpha1.KubeProxyConfiguration) {
			c.FeatureGates = map[string]bool{"KubeProxyNFTablesLocalhostNodePorts": true, "AllBeta": true}
		}},
		{name: "unknown gate", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.FeatureGates = map[string]bool{"NoSuchGate": true} }, fields: []string{"featureGates"}, detail: "unrecognized feature gate: NoSuchGate"},
		{name: "locked GA gate set off", edit: func(c *v1alpha1.KubeProxyConfiguration) {
			c.FeatureGates = map[string]bool{"NFTablesProxyMode": false}
		}, fields: []string{"featureGates"}, detail: "locked"},

		// iptables section: masqueradeBit is checked in every mode
		{name: "masqueradeBit 0", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.IPTables.MasqueradeBit = ptr.To[int32](0) }},
		{name: "masqueradeBit 31", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.IPTables.MasqueradeBit = ptr.To[int32](31) }},
		{name: "masqueradeBit 32", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.IPTables.MasqueradeBit = ptr.To[int32](32) }, fields: []string{"iptables.masqueradeBit"}, detail: "[0, 31]"},
		{name: "masqueradeBit -1 in nftables mode", edit: func(c *v1alpha1.KubeProxyConfiguration) {
			c.Mode = "nftables"
			c.IPTables.MasqueradeBit = ptr.To[int32](-1)
		}, fields: []string{"iptables.masqueradeBit"}},
		{name: "nftables masqueradeBit 32", edit: func(c *v1alpha1.KubeProxyConfiguration) {
			c.Mode = "nftables"
			c.NFTables.MasqueradeBit = ptr.To[int32](32)
		}, fields: []string{"nftables.masqueradeBit"}},
		{name: "nftables masqueradeBit unused in iptables mode", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.NFTables.MasqueradeBit = ptr.To[int32](32) }},

		// sync periods of the effective mode only
		{name: "iptables syncPeriod 0", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.IPTables.SyncPeriod.Duration = 0 }, fields: []string{"iptables.syncPeriod", "iptables.syncPeriod"}},
		{name: "iptables minSyncPeriod negative", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.IPTables.MinSyncPeriod = neg }, fields: []string{"iptables.minSyncPeriod"}},
		{name: "iptables minSyncPeriod 0", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.IPTables.MinSyncPeriod.Duration = 0 }},
		{name: "iptables min above sync", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.IPTables.MinSyncPeriod.Duration = time.Minute }, fields: []string{"iptables.syncPeriod"}, detail: "must be greater than or equal to iptables.minSyncPeriod"},
		{name: "min equal to sync", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.IPTables.MinSyncPeriod.Duration = 30 * time.Second }},
		{name: "ipvs min above sync", edit: func(c *v1alpha1.KubeProxyConfiguration) {
			c.Mode = "ipvs"
			c.IPVS.MinSyncPeriod.Duration = time.Hour
		}, fields: []string{"ipvs.syncPeriod"}},
		{name: "nftables syncPeriod negative", edit: func(c *v1alpha1.KubeProxyConfiguration) {
			c.Mode = "nftables"
			c.NFTables.SyncPeriod = neg
		}, fields: []string{"nftables.syncPeriod", "nftables.syncPeriod"}},
		{name: "other modes' sync periods are not checked", edit: func(c *v1alpha1.KubeProxyConfiguration) {
			c.Mode = "nftables"
			c.IPTables.SyncPeriod = neg
			c.IPVS.SyncPeriod = neg
		}},

		// ipvs section, ipvs mode only
		{name: "ipvs good", edit: func(c *v1alpha1.KubeProxyConfiguration) {
			c.Mode = "ipvs"
			c.IPVS.Scheduler = "wrr"
			c.IPVS.ExcludeCIDRs = []string{"192.0.2.0/24", "fd00::/64"}
			c.IPVS.TCPTimeout.Duration = time.Minute
		}},
		{name: "ipvs bad", edit: func(c *v1alpha1.KubeProxyConfiguration) {
			c.Mode = "ipvs"
			c.IPVS.Scheduler = "roundrobin"
			c.IPVS.ExcludeCIDRs = []string{"192.0.2.0/24", "192.0.2.1"}
			c.IPVS.TCPTimeout = neg
			c.IPVS.TCPFinTimeout = neg
			c.IPVS.UDPTimeout = neg
		}, fields: []string{"ipvs.excludeCIDRs[1]", "ipvs.scheduler", "ipvs.tcpFinTimeout", "ipvs.tcpTimeout", "ipvs.udpTimeout"}},
		{name: "ipvs section ignored in iptables mode", edit: func(c *v1alpha1.KubeProxyConfiguration) {
			c.IPVS.Scheduler = "roundrobin"
			c.IPVS.ExcludeCIDRs = []string{"nope"}
		}},

		// conntrack
		{name: "conntrack zeroes", edit: func(c *v1alpha1.KubeProxyConfiguration) {
			c.Conntrack.MaxPerCore = ptr.To[int32](0)
			c.Conntrack.Min = ptr.To[int32](0)
			c.Conntrack.TCPEstablishedTimeout = &metav1.Duration{}
		}},
		{name: "conntrack negatives", edit: func(c *v1alpha1.KubeProxyConfiguration) {
			c.Conntrack.MaxPerCore = ptr.To[int32](-1)
			c.Conntrack.Min = ptr.To[int32](-1)
			c.Conntrack.TCPEstablishedTimeout = &neg
			c.Conntrack.TCPCloseWaitTimeout = &neg
			c.Conntrack.UDPTimeout = neg
			c.Conntrack.UDPStreamTimeout = neg
		}, fields: []string{"conntrack.maxPerCore", "conntrack.min", "conntrack.tcpEstablishedTimeout", "conntrack.tcpCloseWaitTimeout", "conntrack.udpTimeout", "conntrack.udpStreamTimeout"}},

		// top level
		{name: "oomScoreAdj -1000", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.OOMScoreAdj = ptr.To[int32](-1000) }},
		{name: "oomScoreAdj 1001", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.OOMScoreAdj = ptr.To[int32](1001) }, fields: []string{"oomScoreAdj"}},
		{name: "burst negative", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.ClientConnection.Burst = -1 }, fields: []string{"clientConnection.burst"}},
		{name: "configSyncPeriod negative", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.ConfigSyncPeriod = neg }, fields: []string{"configSyncPeriod"}},
		{name: "bindAddress IPv6", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.BindAddress = "::" }},
		{name: "bindAddress with port", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.BindAddress = "192.0.2.1:2000" }, fields: []string{"bindAddress"}},
		{name: "servers disabled", edit: func(c *v1alpha1.KubeProxyConfiguration) {
			c.HealthzBindAddress = ""
			c.MetricsBindAddress = ""
		}},
		{name: "servers IPv6", edit: func(c *v1alpha1.KubeProxyConfiguration) {
			c.HealthzBindAddress = "[::]:10256"
			c.MetricsBindAddress = "[::1]:10249"
		}},
		{name: "healthz without port", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.HealthzBindAddress = "0.0.0.0" }, fields: []string{"healthzBindAddress"}, detail: "must be IP:port"},
		{name: "metrics bad host and port", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.MetricsBindAddress = "localhost:70000" }, fields: []string{"metricsBindAddress", "metricsBindAddress"}},
		{name: "metrics port 0", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.MetricsBindAddress = "127.0.0.1:0" }, fields: []string{"metricsBindAddress"}},
		{name: "hostnameOverride ok", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.HostnameOverride = "node-1.example" }},
		{name: "hostnameOverride not a node name", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.HostnameOverride = "Node_1" }, fields: []string{"hostnameOverride"}},
		// Used trimmed and lower-cased, as upstream (node-a).
		{name: "hostnameOverride upper case and blanks", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.HostnameOverride = " Node-A\n" }},
		{name: "hostnameOverride blank", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.HostnameOverride = "  " }, fields: []string{"hostnameOverride"}},

		// nodePortAddresses
		{name: "nodePortAddresses mixed", edit: func(c *v1alpha1.KubeProxyConfiguration) {
			c.NodePortAddresses = []string{"primary", "localhost", "192.0.2.0/24", "fd00::/64", "all"}
		}},
		{name: "nodePortAddresses bad entries", edit: func(c *v1alpha1.KubeProxyConfiguration) {
			c.NodePortAddresses = []string{"192.0.2.0/24", "192.0.2.1", "Localhost", "primary", "primary"}
		}, fields: []string{"nodePortAddresses[1]", "nodePortAddresses[2]", "nodePortAddresses[4]"}},

		// showHiddenMetricsForVersion
		{name: "hidden metrics previous minor", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.ShowHiddenMetricsForVersion = "1.36" }},
		{name: "hidden metrics two back", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.ShowHiddenMetricsForVersion = "1.35" }, fields: []string{"showHiddenMetricsForVersion"}, detail: "1.36"},
		{name: "hidden metrics garbage", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.ShowHiddenMetricsForVersion = "latest" }, fields: []string{"showHiddenMetricsForVersion"}},

		// detectLocalMode and companions
		{name: "ClusterCIDR with empty clusterCIDR", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.ClusterCIDR = "" }},
		{name: "dual-stack clusterCIDR", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.ClusterCIDR = "10.244.0.0/16,fd00::/64" }},
		{name: "clusterCIDR malformed", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.ClusterCIDR = "10.244.0.0/16,nope" }, fields: []string{"clusterCIDR"}},
		{name: "clusterCIDR single-stack pair", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.ClusterCIDR = "10.244.0.0/16,10.0.0.0/8" }, fields: []string{"clusterCIDR"}, detail: "dual-stack"},
		{name: "clusterCIDR three", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.ClusterCIDR = "10.244.0.0/16,fd00::/64,10.0.0.0/8" }, fields: []string{"clusterCIDR"}},
		{name: "clusterCIDR unused in NodeCIDR mode", edit: func(c *v1alpha1.KubeProxyConfiguration) {
			c.DetectLocalMode = "NodeCIDR"
			c.ClusterCIDR = "nope"
		}},
		{name: "detectLocalMode bogus", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.DetectLocalMode = "PodCIDR" }, fields: []string{"detectLocalMode"}},
		{name: "BridgeInterface ok", edit: func(c *v1alpha1.KubeProxyConfiguration) {
			c.DetectLocalMode = "BridgeInterface"
			c.DetectLocal.BridgeInterface = "cbr0"
		}},
		{name: "BridgeInterface missing", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.DetectLocalMode = "BridgeInterface" }, fields: []string{"detectLocal.bridgeInterface"}},
		{name: "InterfaceNamePrefix missing", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.DetectLocalMode = "InterfaceNamePrefix" }, fields: []string{"detectLocal.interfaceNamePrefix"}},
		{name: "InterfaceNamePrefix ok", edit: func(c *v1alpha1.KubeProxyConfiguration) {
			c.DetectLocalMode = "InterfaceNamePrefix"
			c.DetectLocal.InterfaceNamePrefix = "veth"
		}},

		// logging
		{name: "logging json", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.Logging.Format = "json" }},
		{name: "logging bad format", edit: func(c *v1alpha1.KubeProxyConfiguration) { c.Logging.Format = "xml" }, fields: []string{"logging.format"}},
		{name: "logging vmodule with json", edit: func(c *v1alpha1.KubeProxyConfiguration) {
			c.Logging.Format = "json"
			c.Logging.VModule = []logsapi.VModuleItem{{FilePattern: "proxier.go", Verbosity: 4}}
		}, fields: []string{"logging.vmodule"}},
		{name: "logging bad vmodule and flush", edit: func(c *v1alpha1.KubeProxyConfiguration) {
			c.Logging.FlushFrequency.Duration.Duration = 0
			c.Logging.VModule = []logsapi.VModuleItem{{FilePattern: "", Verbosity: 1}, {FilePattern: "a=b", Verbosity: 1}}
		}, fields: []string{"logging.flushFrequency", "logging.vmodule[0].filePattern", "logging.vmodule[1].filePattern"}},
		{name: "logging alpha options need the gate", edit: func(c *v1alpha1.KubeProxyConfiguration) {
			c.Logging.Options.Text.SplitStream = true
			c.Logging.Options.Text.InfoBufferSize = resource.QuantityValue{Quantity: resource.MustParse("1Ki")}
		}, fields: []string{"logging.options.text.infoBufferSize", "logging.options.text.splitStream"}},
		{name: "logging alpha options with the gate", edit: func(c *v1alpha1.KubeProxyConfiguration) {
			c.FeatureGates = map[string]bool{"LoggingAlphaOptions": true}
			c.Logging.Options.Text.SplitStream = true
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(validConfig(tc.edit))
			got := errorFields(t, err)
			if strings.Join(got, " ") != strings.Join(tc.fields, " ") {
				t.Fatalf("error fields = %q, want %q (error: %v)", got, tc.fields, err)
			}
			if tc.detail != "" && !strings.Contains(err.Error(), tc.detail) {
				t.Errorf("error %q does not mention %q", err, tc.detail)
			}
		})
	}
}

func TestValidateMessageNamesValue(t *testing.T) {
	err := Validate(validConfig(func(c *v1alpha1.KubeProxyConfiguration) { c.IPTables.MasqueradeBit = ptr.To[int32](40) }))
	want := "iptables.masqueradeBit: Invalid value: 40: must be within the range [0, 31]"
	if err == nil || err.Error() != want {
		t.Fatalf("error = %v, want %q", err, want)
	}
}
