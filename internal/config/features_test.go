package config

import (
	"strings"
	"testing"

	clientfeatures "k8s.io/client-go/features"
	"k8s.io/component-base/featuregate"
	"k8s.io/component-base/metrics/legacyregistry"
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
				PreferSameTrafficDistribution: true, MultiCIDRServiceAllocator: true, "InPlacePodVerticalScaling": true, "LoggingAlphaOptions": false, "LoggingBetaOptions": true,
			},
		},
		{
			name:    "explicit values",
			gates:   map[string]bool{"KubeProxyNFTablesLocalhostNodePorts": true, "NFTablesNetlink": false, "KubeProxyIPVS": false},
			enabled: map[featuregate.Feature]bool{KubeProxyNFTablesLocalhostNodePorts: true, NFTablesNetlink: false, KubeProxyIPVS: false},
		},
		{
			name:    "AllAlpha turns alpha gates on",
			gates:   map[string]bool{"AllAlpha": true, "AllBeta": true},
			enabled: map[featuregate.Feature]bool{KubeProxyNFTablesLocalhostNodePorts: true, "LoggingAlphaOptions": true},
		},
		// Upstream v1.37.2 refuses AllAlpha alone: some alpha gates depend on
		// GenericWorkload, a beta gate off by default.
		{name: "AllAlpha alone", gates: map[string]bool{"AllAlpha": true}, err: "depends on features that are disabled: [GenericWorkload]"},
		{name: "unknown gate", gates: map[string]bool{"KubeProxyWarpDrive": true}, err: "unrecognized feature gate: KubeProxyWarpDrive"},
		{name: "locked gate", gates: map[string]bool{"MultiCIDRServiceAllocator": false}, err: "locked to true"},
		// Gates that do not concern the proxy are accepted, as upstream.
		{
			name:    "other components' gates",
			gates:   map[string]bool{"InPlacePodVerticalScaling": true, "WatchListClient": false, "ComponentFlagz": false, "ContextualLogging": true},
			enabled: map[featuregate.Feature]bool{"InPlacePodVerticalScaling": true, "WatchListClient": false, ComponentFlagz: false, ComponentStatusz: true},
		},
		{name: "locked gate of another component", gates: map[string]bool{"InPlacePodVerticalScaling": false}, err: "cannot set feature gate InPlacePodVerticalScaling to false, feature is locked to true"},
		// Gates upstream removed are refused.
		{name: "removed gate TopologyAwareHints", gates: map[string]bool{"TopologyAwareHints": true}, err: "unrecognized feature gate: TopologyAwareHints"},
		{name: "removed gate ServiceTrafficDistribution", gates: map[string]bool{"ServiceTrafficDistribution": true}, err: "unrecognized feature gate: ServiceTrafficDistribution"},
		// A gate whose dependencies are on is accepted; one whose dependency
		// is off is refused.
		{name: "dependency enabled", gates: map[string]bool{"InPlacePodVerticalScalingExclusiveCPUs": true}, enabled: map[featuregate.Feature]bool{"InPlacePodVerticalScalingExclusiveCPUs": true}},
		{name: "dependency disabled", gates: map[string]bool{"ResourceHealthStatusMessage": true, "ResourceHealthStatus": false}, err: "ResourceHealthStatusMessage is enabled, but depends on features that are disabled: [ResourceHealthStatus]"},
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

// TestApplyFeatureGates: every gate is reported in kubernetes_feature_enabled
// with its stage and state, and client-go's feature checks read the
// configured gates.
func TestApplyFeatureGates(t *testing.T) {
	defer clientfeatures.ReplaceFeatureGates(clientGates{newKnownFeatureGate()})
	_, err := ApplyFeatureGates(&v1alpha1.KubeProxyConfiguration{FeatureGates: map[string]bool{
		"KubeProxyNFTablesLocalhostNodePorts": true,
		"WatchListClient":                     false,
		"InPlacePodVerticalScaling":           true,
	}})
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "kubernetes_feature_enabled" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var name, stage string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "name":
					name = l.GetValue()
				case "stage":
					stage = l.GetValue()
				}
			}
			got[name+"/"+stage] = m.GetGauge().GetValue()
		}
	}
	for key, want := range map[string]float64{
		"KubeProxyNFTablesLocalhostNodePorts/ALPHA": 1,
		"WatchListClient/BETA":                      0,
		"InPlacePodVerticalScaling/":                1, // GA gates have stage ""
		"KubeProxyIPVS/DEPRECATED":                  1,
		"PreferSameTrafficDistribution/":            1,
	} {
		if v, ok := got[key]; !ok || v != want {
			t.Errorf("kubernetes_feature_enabled %s = %v (present %v), want %v", key, v, ok, want)
		}
	}
	if len(got) != len(upstreamFeatureGates)+2 { // + AllAlpha, AllBeta
		t.Errorf("kubernetes_feature_enabled has %d gates, want %d", len(got), len(upstreamFeatureGates)+2)
	}
	if clientfeatures.FeatureGates().Enabled(clientfeatures.WatchListClient) {
		t.Error("client-go's WatchListClient still on after featureGates set it off")
	}
}
