package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/component-base/metrics/legacyregistry"

	// As upstream's cmd/kube-proxy/proxy.go: client-go's metrics
	// (rest_client_*, workqueue_*, ...). kubernetes_build_info is
	// buildinfo.go's, with kproxy's version.
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
)

// Component metrics are those upstream kube-proxy serves beside
// kubeproxy_*, all from component-base's legacy registry: go_* and
// process_* (with the runtime/metrics set upstream enables),
// rest_client_* (client-go's request metrics, which kproxy's API client
// records once this package is linked in), kubernetes_build_info,
// kubernetes_feature_enabled (set by the feature gate's AddMetrics) and
// registered_metrics_total. kproxy serves that registry as it is, so names,
// types, help and labels are upstream's by construction.
//
// registered_metrics_total counts metrics registered through
// component-base: upstream's kubeproxy_* (metrics.go registers them there,
// all of them, where upstream registers those of its mode) and kproxy's
// own kproxy_*, not the kernel packet counters (custom collectors, which
// upstream's count does not include either).

// Gatherer is what /metrics serves: the component-base legacy registry and
// Registry (the kernel packet counters).
var Gatherer prometheus.Gatherer = prometheus.Gatherers{legacyregistry.DefaultGatherer, Registry}
