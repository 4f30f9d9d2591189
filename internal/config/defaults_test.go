package config

// Addresses: 192.0.2.1 (TEST-NET-1) and 2001:db8::1 (documentation range)
// stand for node addresses; nothing is contacted.

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	componentbaseconfigv1alpha1 "k8s.io/component-base/config/v1alpha1"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/kube-proxy/config/v1alpha1"
	"k8s.io/utils/ptr"
)

func TestDefaultsOfEmptyConfig(t *testing.T) {
	got := &v1alpha1.KubeProxyConfiguration{}
	Defaults(got)
	zeroBuf := resource.QuantityValue{Quantity: *resource.NewQuantity(0, resource.DecimalSI)}
	_ = zeroBuf.String()
	want := &v1alpha1.KubeProxyConfiguration{
		TypeMeta:     metav1.TypeMeta{APIVersion: "kubeproxy.config.k8s.io/v1alpha1", Kind: "KubeProxyConfiguration"},
		FeatureGates: map[string]bool{},
		ClientConnection: componentbaseconfigv1alpha1.ClientConnectionConfiguration{
			ContentType: "application/vnd.kubernetes.protobuf", QPS: 5, Burst: 10,
		},
		Logging: logsapi.LoggingConfiguration{
			Format:         "text",
			FlushFrequency: logsapi.TimeOrMetaDuration{Duration: metav1.Duration{Duration: 5 * time.Second}, SerializeAsString: true},
			Options: logsapi.FormatOptions{
				Text: logsapi.TextOptions{OutputRoutingOptions: logsapi.OutputRoutingOptions{InfoBufferSize: zeroBuf}},
				JSON: logsapi.JSONOptions{OutputRoutingOptions: logsapi.OutputRoutingOptions{InfoBufferSize: zeroBuf}},
			},
		},
		BindAddress:        "0.0.0.0",
		HealthzBindAddress: "0.0.0.0:10256",
		MetricsBindAddress: "127.0.0.1:10249",
		Mode:               "",
		IPTables: v1alpha1.KubeProxyIPTablesConfiguration{
			MasqueradeBit:      ptr.To[int32](14),
			LocalhostNodePorts: ptr.To(true),
			SyncPeriod:         metav1.Duration{Duration: 30 * time.Second},
			MinSyncPeriod:      metav1.Duration{Duration: time.Second},
		},
		IPVS: v1alpha1.KubeProxyIPVSConfiguration{
			SyncPeriod: metav1.Duration{Duration: 30 * time.Second},
		},
		NFTables: v1alpha1.KubeProxyNFTablesConfiguration{
			MasqueradeBit: ptr.To[int32](14),
			SyncPeriod:    metav1.Duration{Duration: 30 * time.Second},
			MinSyncPeriod: metav1.Duration{Duration: time.Second},
		},
		DetectLocalMode: "ClusterCIDR",
		OOMScoreAdj:     ptr.To[int32](-999),
		Conntrack: v1alpha1.KubeProxyConntrackConfiguration{
			MaxPerCore:            ptr.To[int32](32768),
			Min:                   ptr.To[int32](131072),
			TCPEstablishedTimeout: &metav1.Duration{Duration: 24 * time.Hour},
			TCPCloseWaitTimeout:   &metav1.Duration{Duration: time.Hour},
		},
		ConfigSyncPeriod: metav1.Duration{Duration: 15 * time.Minute},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("Defaults mismatch (-want +got):\n%s", diff)
	}
}

func TestDefaultsServerAddresses(t *testing.T) {
	cases := []struct {
		name                     string
		bind, healthz, metrics   string
		wantHealthz, wantMetrics string
	}{
		{name: "IPv4 node", bind: "192.0.2.1", wantHealthz: "0.0.0.0:10256", wantMetrics: "127.0.0.1:10249"},
		{name: "IPv6 node", bind: "::", wantHealthz: "[::]:10256", wantMetrics: "[::1]:10249"},
		{name: "bare IPs get the port", healthz: "192.0.2.1", metrics: "2001:db8::1", wantHealthz: "192.0.2.1:10256", wantMetrics: "[2001:db8::1]:10249"},
		{name: "ports kept", healthz: "192.0.2.1:1234", metrics: "[::1]:4321", wantHealthz: "192.0.2.1:1234", wantMetrics: "[::1]:4321"},
		{name: "garbage left for Validate", healthz: "nope", metrics: "nope:1", wantHealthz: "nope", wantMetrics: "nope:1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := &v1alpha1.KubeProxyConfiguration{BindAddress: tc.bind, HealthzBindAddress: tc.healthz, MetricsBindAddress: tc.metrics}
			Defaults(c)
			if c.HealthzBindAddress != tc.wantHealthz || c.MetricsBindAddress != tc.wantMetrics {
				t.Errorf("healthz, metrics = %q, %q; want %q, %q", c.HealthzBindAddress, c.MetricsBindAddress, tc.wantHealthz, tc.wantMetrics)
			}
		})
	}
}

func TestDefaultsKeepSetValues(t *testing.T) {
	c := &v1alpha1.KubeProxyConfiguration{
		Mode:            "nftables",
		DetectLocalMode: "NodeCIDR",
		OOMScoreAdj:     ptr.To[int32](0),
		IPTables:        v1alpha1.KubeProxyIPTablesConfiguration{MasqueradeBit: ptr.To[int32](0), LocalhostNodePorts: ptr.To(false)},
		Conntrack:       v1alpha1.KubeProxyConntrackConfiguration{MaxPerCore: ptr.To[int32](0)},
		NFTables:        v1alpha1.KubeProxyNFTablesConfiguration{SyncPeriod: metav1.Duration{Duration: time.Minute}},
	}
	Defaults(c)
	if c.Mode != "nftables" || c.DetectLocalMode != "NodeCIDR" || *c.OOMScoreAdj != 0 || *c.IPTables.MasqueradeBit != 0 ||
		*c.IPTables.LocalhostNodePorts || *c.Conntrack.MaxPerCore != 0 || c.NFTables.SyncPeriod.Duration != time.Minute {
		t.Errorf("Defaults overwrote explicit values: %+v", c)
	}
	if *c.Conntrack.Min != 131072 || c.NFTables.MinSyncPeriod.Duration != time.Second {
		t.Errorf("Defaults did not fill the unset fields next to the set ones: min=%d nftables.minSyncPeriod=%v", *c.Conntrack.Min, c.NFTables.MinSyncPeriod)
	}
}

func TestEffectiveModeValues(t *testing.T) {
	c := validConfig(func(c *v1alpha1.KubeProxyConfiguration) {
		c.IPTables = v1alpha1.KubeProxyIPTablesConfiguration{MasqueradeBit: ptr.To[int32](10), MasqueradeAll: true,
			SyncPeriod: metav1.Duration{Duration: 11 * time.Second}, MinSyncPeriod: metav1.Duration{Duration: 1 * time.Second}}
		c.IPVS.SyncPeriod.Duration, c.IPVS.MinSyncPeriod.Duration = 22*time.Second, 2*time.Second
		c.NFTables = v1alpha1.KubeProxyNFTablesConfiguration{MasqueradeBit: ptr.To[int32](20), MasqueradeAll: false,
			SyncPeriod: metav1.Duration{Duration: 33 * time.Second}, MinSyncPeriod: metav1.Duration{Duration: 3 * time.Second}}
	})
	cases := []struct {
		mode          v1alpha1.ProxyMode
		effective     string
		sync, minSync time.Duration
		masqAll       bool
		masqBit       int32
	}{
		{"", "iptables", 11 * time.Second, time.Second, true, 10},
		{"iptables", "iptables", 11 * time.Second, time.Second, true, 10},
		{"ipvs", "ipvs", 22 * time.Second, 2 * time.Second, true, 10},
		{"nftables", "nftables", 33 * time.Second, 3 * time.Second, false, 20},
	}
	for _, tc := range cases {
		c.Mode = tc.mode
		sync, minSync := SyncPeriods(c)
		if got := EffectiveMode(c); got != tc.effective {
			t.Errorf("mode %q: EffectiveMode = %q, want %q", tc.mode, got, tc.effective)
		}
		if sync != tc.sync || minSync != tc.minSync {
			t.Errorf("mode %q: SyncPeriods = %v, %v; want %v, %v", tc.mode, sync, minSync, tc.sync, tc.minSync)
		}
		if got := MasqueradeAll(c); got != tc.masqAll {
			t.Errorf("mode %q: MasqueradeAll = %v, want %v", tc.mode, got, tc.masqAll)
		}
		if got := MasqueradeBit(c); got != tc.masqBit {
			t.Errorf("mode %q: MasqueradeBit = %d, want %d", tc.mode, got, tc.masqBit)
		}
	}
}
