package config

import (
	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"
	"k8s.io/kube-proxy/config/v1alpha1"
)

// Feature gates that kube-proxy v1.37 reads (or that decide what its
// configuration may say), with their v1.37 state. Upstream kube-proxy
// registers every Kubernetes gate; kproxy knows only these plus the logging
// gates of component-base and AllAlpha/AllBeta, so a gate that only matters to
// other components is reported as unrecognized. Setting a locked GA gate to
// its non-default value is an error, as upstream.
const (
	// KubeProxyIPVS enables the ipvs mode (deprecated, on by default, 1.37).
	KubeProxyIPVS featuregate.Feature = "KubeProxyIPVS"
	// KubeProxyNFTablesLocalhostNodePorts serves NodePorts on loopback in
	// nftables mode through a userspace proxy (alpha, 1.37).
	KubeProxyNFTablesLocalhostNodePorts featuregate.Feature = "KubeProxyNFTablesLocalhostNodePorts"
	// NFTablesNetlink makes nftables mode talk netlink instead of running
	// nft (beta, on, 1.37).
	NFTablesNetlink featuregate.Feature = "NFTablesNetlink"
	// NFTablesProxyMode allowed --proxy-mode=nftables (GA since 1.33).
	NFTablesProxyMode featuregate.Feature = "NFTablesProxyMode"
	// TopologyAwareHints makes kube-proxy honour EndpointSlice hints.
	TopologyAwareHints featuregate.Feature = "TopologyAwareHints"
	// ServiceTrafficDistribution allows spec.trafficDistribution.
	ServiceTrafficDistribution featuregate.Feature = "ServiceTrafficDistribution"
	// PreferSameTrafficDistribution allows PreferSameZone/PreferSameNode.
	PreferSameTrafficDistribution featuregate.Feature = "PreferSameTrafficDistribution"
	// MultiCIDRServiceAllocator exposes ServiceCIDR objects (used by the
	// nftables mode to drop traffic to unallocated cluster IPs).
	MultiCIDRServiceAllocator featuregate.Feature = "MultiCIDRServiceAllocator"
	// WinDSR and WinOverlay are Windows-only; accepted for config sharing.
	WinDSR     featuregate.Feature = "WinDSR"
	WinOverlay featuregate.Feature = "WinOverlay"
	// Component endpoints served by kube-proxy's metrics server.
	ComponentFlagz   featuregate.Feature = "ComponentFlagz"
	ComponentStatusz featuregate.Feature = "ComponentStatusz"
	ComponentSLIs    featuregate.Feature = "ComponentSLIs"
)

var kubeProxyFeatureGates = map[featuregate.Feature]featuregate.VersionedSpecs{
	KubeProxyIPVS: {
		// A gate introduced as deprecated needs its earlier (GA) state.
		{Version: version.MustParse("1.0"), Default: true, PreRelease: featuregate.GA},
		{Version: version.MustParse("1.37"), Default: true, PreRelease: featuregate.Deprecated},
	},
	KubeProxyNFTablesLocalhostNodePorts: {
		{Version: version.MustParse("1.37"), Default: false, PreRelease: featuregate.Alpha},
	},
	NFTablesNetlink: {
		{Version: version.MustParse("1.37"), Default: true, PreRelease: featuregate.Beta},
	},
	NFTablesProxyMode: {
		{Version: version.MustParse("1.29"), Default: false, PreRelease: featuregate.Alpha},
		{Version: version.MustParse("1.31"), Default: true, PreRelease: featuregate.Beta},
		{Version: version.MustParse("1.33"), Default: true, PreRelease: featuregate.GA, LockToDefault: true},
	},
	TopologyAwareHints: {
		{Version: version.MustParse("1.24"), Default: true, PreRelease: featuregate.Beta},
		{Version: version.MustParse("1.33"), Default: true, PreRelease: featuregate.GA, LockToDefault: true},
	},
	ServiceTrafficDistribution: {
		{Version: version.MustParse("1.31"), Default: true, PreRelease: featuregate.Beta},
		{Version: version.MustParse("1.33"), Default: true, PreRelease: featuregate.GA, LockToDefault: true},
	},
	PreferSameTrafficDistribution: {
		{Version: version.MustParse("1.34"), Default: true, PreRelease: featuregate.Beta},
		{Version: version.MustParse("1.35"), Default: true, PreRelease: featuregate.GA, LockToDefault: true},
	},
	MultiCIDRServiceAllocator: {
		{Version: version.MustParse("1.33"), Default: true, PreRelease: featuregate.GA},
		{Version: version.MustParse("1.34"), Default: true, PreRelease: featuregate.GA, LockToDefault: true},
	},
	WinDSR: {
		{Version: version.MustParse("1.33"), Default: true, PreRelease: featuregate.Beta},
		{Version: version.MustParse("1.34"), Default: true, PreRelease: featuregate.GA, LockToDefault: true},
	},
	WinOverlay: {
		{Version: version.MustParse("1.20"), Default: true, PreRelease: featuregate.Beta},
		{Version: version.MustParse("1.34"), Default: true, PreRelease: featuregate.GA, LockToDefault: true},
	},
	ComponentFlagz: {
		{Version: version.MustParse("1.32"), Default: true, PreRelease: featuregate.Beta},
	},
	ComponentStatusz: {
		{Version: version.MustParse("1.32"), Default: false, PreRelease: featuregate.Alpha},
		{Version: version.MustParse("1.36"), Default: true, PreRelease: featuregate.Beta},
	},
	ComponentSLIs: {
		{Version: version.MustParse("1.27"), Default: true, PreRelease: featuregate.Beta},
		{Version: version.MustParse("1.32"), Default: true, PreRelease: featuregate.GA, LockToDefault: true},
	},
}

// mutableGate is what featuregate.NewVersionedFeatureGate really returns.
type mutableGate interface {
	featuregate.MutableVersionedFeatureGate
	featuregate.MutableFeatureGateWithLogger
}

// newKnownFeatureGate returns a fresh gate holding every gate kproxy knows,
// at their v1.37 defaults.
func newKnownFeatureGate() mutableGate {
	fg := featuregate.NewVersionedFeatureGate(version.MustParse(KubernetesVersion))
	if err := fg.AddVersioned(kubeProxyFeatureGates); err != nil {
		panic("kproxy feature gate table: " + err.Error())
	}
	if err := logsapi.AddFeatureGates(fg); err != nil {
		panic("logging feature gates: " + err.Error())
	}
	return fg
}

// KnownFeatureGates lists the gates kproxy accepts, in the "Name=true|false
// (STAGE - default=X)" form used by the --feature-gates help text.
func KnownFeatureGates() []string {
	return newKnownFeatureGate().KnownFeatures()
}

// NewFeatureGate returns the feature gate state that c.FeatureGates asks for.
// It fails for unknown gates and for locked gates set to the wrong value;
// warnings about deprecated or GA gates are logged through klog.
func NewFeatureGate(c *v1alpha1.KubeProxyConfiguration) (featuregate.FeatureGate, error) {
	return newFeatureGate(c.FeatureGates, klog.Background())
}

func newFeatureGate(m map[string]bool, logger logr.Logger) (mutableGate, error) {
	fg := newKnownFeatureGate()
	if err := fg.SetFromMapWithLogger(logger, m); err != nil {
		return nil, err
	}
	return fg, nil
}
