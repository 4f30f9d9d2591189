package config

import (
	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/version"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/component-base/featuregate"
	metricsfeatures "k8s.io/component-base/metrics/features"
	"k8s.io/klog/v2"
	"k8s.io/kube-proxy/config/v1alpha1"
)

//go:generate sh -c "cd ../../test/tools && go run ./cmd/featuregates -o ../../internal/config/zz_generated_featuregates.go"

// kproxy accepts exactly the feature gates upstream kube-proxy v1.37.2
// accepts: every Kubernetes gate (with client-go's and the zpages gates) and
// the component-base metrics and logging gates kube-proxy registers. The
// table, zz_generated_featuregates.go, is generated from k8s.io/kubernetes
// by test/tools/cmd/featuregates, whose test fails when it is stale. A gate
// that does not concern the proxy is accepted and has no effect; an unknown
// or removed gate, a locked gate set to the other value and an enabled gate
// whose dependency is disabled are refused, as upstream.
//
// The gates kproxy reads:
const (
	// KubeProxyIPVS enables the ipvs mode (deprecated, on by default, 1.37).
	KubeProxyIPVS featuregate.Feature = "KubeProxyIPVS"
	// KubeProxyNFTablesLocalhostNodePorts serves NodePorts on loopback in
	// nftables mode through a userspace proxy (alpha, 1.37).
	KubeProxyNFTablesLocalhostNodePorts featuregate.Feature = "KubeProxyNFTablesLocalhostNodePorts"
	// NFTablesNetlink makes nftables mode talk netlink instead of running
	// nft (beta, on, 1.37).
	NFTablesNetlink featuregate.Feature = "NFTablesNetlink"
	// PreferSameTrafficDistribution allows PreferSameZone/PreferSameNode.
	PreferSameTrafficDistribution featuregate.Feature = "PreferSameTrafficDistribution"
	// MultiCIDRServiceAllocator exposes ServiceCIDR objects (used by the
	// nftables mode to drop traffic to unallocated cluster IPs).
	MultiCIDRServiceAllocator featuregate.Feature = "MultiCIDRServiceAllocator"
	// ComponentFlagz and ComponentStatusz serve /flagz and /statusz on the
	// metrics server.
	ComponentFlagz   featuregate.Feature = "ComponentFlagz"
	ComponentStatusz featuregate.Feature = "ComponentStatusz"
)

// mutableGate is what featuregate.NewVersionedFeatureGate really returns.
type mutableGate interface {
	featuregate.MutableVersionedFeatureGate
	featuregate.MutableFeatureGateWithLogger
}

// newKnownFeatureGate returns a fresh gate holding every gate kproxy knows,
// at their v1.37 defaults.
func newKnownFeatureGate() mutableGate {
	fg := featuregate.NewVersionedFeatureGate(version.MustParse(KubernetesVersion))
	if err := fg.AddVersioned(upstreamFeatureGates); err != nil {
		panic("kproxy feature gate table: " + err.Error())
	}
	if err := fg.AddDependencies(upstreamFeatureGateDependencies); err != nil {
		panic("kproxy feature gate dependencies: " + err.Error())
	}
	return fg
}

// KnownFeatureGates lists the gates kproxy accepts, in the "Name=true|false
// (STAGE - default=X)" form used by the --feature-gates help text.
func KnownFeatureGates() []string {
	return newKnownFeatureGate().KnownFeatures()
}

// NewFeatureGate returns the feature gate state that c.FeatureGates asks for.
// It fails for unknown gates, locked gates set to the other value and
// enabled gates whose dependencies are off;
// warnings about deprecated or GA gates are logged through klog.
func NewFeatureGate(c *v1alpha1.KubeProxyConfiguration) (featuregate.FeatureGate, error) {
	return newFeatureGate(c.FeatureGates, klog.Background())
}

// ApplyFeatureGates does what upstream kube-proxy does with its gates once
// the configuration is valid: it records every known gate in
// kubernetes_feature_enabled (featuregate's AddMetrics) and makes
// client-go's feature checks (e.g. WatchListClient for the informers) read
// this gate, as upstream's pkg/features does. It returns the gate.
func ApplyFeatureGates(c *v1alpha1.KubeProxyConfiguration) (featuregate.FeatureGate, error) {
	fg, err := newFeatureGate(c.FeatureGates, klog.Background())
	if err != nil {
		return nil, err
	}
	// As upstream's Complete: NativeHistograms for component-base metrics.
	metricsfeatures.ApplyFeatureGates(fg)
	fg.AddMetrics()
	clientfeatures.ReplaceFeatureGates(clientGates{fg})
	return fg, nil
}

// clientGates answers client-go's feature checks from a component-base
// gate, which holds client-go's gates too (generated from upstream).
type clientGates struct{ fg featuregate.FeatureGate }

func (g clientGates) Enabled(name clientfeatures.Feature) bool {
	return g.fg.Enabled(featuregate.Feature(name))
}

func newFeatureGate(m map[string]bool, logger logr.Logger) (mutableGate, error) {
	fg := newKnownFeatureGate()
	if err := fg.SetFromMapWithLogger(logger, m); err != nil {
		return nil, err
	}
	return fg, nil
}
