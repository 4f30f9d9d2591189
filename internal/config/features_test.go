package config

import (
	"strings"
	"testing"

	"k8s.io/component-base/featuregate"
	"k8s.io/kube-proxy/config/v1alpha1"
)

func TestNewFeatureGate(t *testing.T) {
	cases := []struct {
		name    string
		gates   map[string]bool
		enabled map[featuregate.Feature]bool
		err     string
	}{
		{
			name: "v1.37 defaults",
			enabled: map[featuregate.Feature]bool{
				KubeProxyIPVS: true, NFTablesNetlink: true, KubeProxyNFTablesLocalhostNodePorts: false,
				TopologyAwareHints: true, PreferSameTrafficDistribution: true, "LoggingAlphaOptions": false, "LoggingBetaOptions": true,
			},
		},
		{
			name:    "explicit values",
			gates:   map[string]bool{"KubeProxyNFTablesLocalhostNodePorts": true, "NFTablesNetlink": false, "KubeProxyIPVS": false},
			enabled: map[featuregate.Feature]bool{KubeProxyNFTablesLocalhostNodePorts: true, NFTablesNetlink: false, KubeProxyIPVS: false},
		},
		{
			name:    "AllAlpha turns alpha gates on",
			gates:   map[string]bool{"AllAlpha": true},
			enabled: map[featuregate.Feature]bool{KubeProxyNFTablesLocalhostNodePorts: true, "LoggingAlphaOptions": true},
		},
		{name: "unknown gate", gates: map[string]bool{"KubeProxyWarpDrive": true}, err: "unrecognized feature gate: KubeProxyWarpDrive"},
		{name: "locked gate", gates: map[string]bool{"MultiCIDRServiceAllocator": false}, err: "locked to true"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fg, err := NewFeatureGate(&v1alpha1.KubeProxyConfiguration{FeatureGates: tc.gates})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for f, want := range tc.enabled {
				if got := fg.Enabled(f); got != want {
					t.Errorf("%s enabled = %v, want %v", f, got, want)
				}
			}
		})
	}
}
