// Package metrics defines kproxy's Prometheus metrics.
//
// The kubeproxy_* metrics keep upstream kube-proxy's names, help texts,
// types, labels and buckets (pkg/proxy/metrics, checked against the v1.36
// metrics reference and the v1.37 sources), so that dashboards and alerts
// written for kube-proxy work unchanged. They are built, as upstream's,
// with k8s.io/component-base/metrics (which prefixes the help of every
// ALPHA metric with "[ALPHA] ") and registered in its legacy registry, so
// registered_metrics_total counts them.
//
// kproxy's own metrics use the kproxy_ prefix. They are component-base
// metrics in the same registry too (their help gets "[ALPHA] " as well),
// so registered_metrics_total counts them as it counts upstream's; their
// series are client_golang's (CounterVec, GaugeVec). The kernel packet
// counters are custom collectors in Registry, which component-base's
// count leaves out, as upstream's custom collectors.
//
// Label values: ip_family is "IPv4" or "IPv6" (string(v1.IPFamily)); code is
// the HTTP status code as decimal text; table is an iptables table name;
// traffic_policy is "internal" or "external".
package metrics

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	k8smetrics "k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
)

const (
	kubeProxySubsystem = "kubeproxy"
	kproxyNamespace    = "kproxy"

	// alpha is the prefix component-base adds to the help of ALPHA metrics.
	alpha = "[ALPHA] "
)

// Label names.
const (
	LabelIPFamily      = "ip_family"
	LabelTable         = "table"
	LabelTrafficPolicy = "traffic_policy"
	LabelCode          = "code"
	LabelProtocol      = "protocol"
	LabelKind          = "kind"
	LabelReason        = "reason"
	LabelMode          = "mode"
	LabelBackend       = "backend"
	LabelVersion       = "version"
)

// syncBuckets are upstream's buckets for the sync duration histograms:
// 1ms doubling up to ~16s.
var syncBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)

// networkProgrammingBuckets are upstream's buckets for
// network_programming_duration_seconds. Upstream merges them onto a slice
// that already holds one zero, so the first bucket is le="0"; kept for
// identical output.
var networkProgrammingBuckets = mergeBuckets(
	prometheus.LinearBuckets(0.25, 0.25, 2), // 0.25s, 0.50s
	prometheus.LinearBuckets(1, 1, 59),      // 1s, 2s, 3s, ... 59s
	prometheus.LinearBuckets(60, 5, 12),     // 60s, 65s, 70s, ... 115s
	prometheus.LinearBuckets(120, 30, 7),    // 2min, 2.5min, 3min, ..., 5min
)

func mergeBuckets(parts ...[]float64) []float64 {
	out := []float64{0}
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// Upstream kube-proxy metrics, built with component-base's metric types
// and registered in its legacy registry as upstream's
// (pkg/proxy/metrics): the help gets "[ALPHA] " from there, and they count
// in registered_metrics_total.
var (
	// SyncProxyRulesLatency is the duration of one sync, full or partial.
	SyncProxyRulesLatency = k8smetrics.NewHistogramVec(&k8smetrics.HistogramOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_duration_seconds",
		Help:      "SyncProxyRules latency in seconds",
		Buckets:   syncBuckets,
	}, []string{LabelIPFamily})

	// SyncFullProxyRulesLatency is the duration of one full sync.
	SyncFullProxyRulesLatency = k8smetrics.NewHistogramVec(&k8smetrics.HistogramOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_full_proxy_rules_duration_seconds",
		Help:      "SyncProxyRules latency in seconds for full resyncs",
		Buckets:   syncBuckets,
	}, []string{LabelIPFamily})

	// SyncPartialProxyRulesLatency is the duration of one partial sync.
	SyncPartialProxyRulesLatency = k8smetrics.NewHistogramVec(&k8smetrics.HistogramOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_partial_proxy_rules_duration_seconds",
		Help:      "SyncProxyRules latency in seconds for partial resyncs",
		Buckets:   syncBuckets,
	}, []string{LabelIPFamily})

	// SyncProxyRulesLastTimestamp is the Unix time of the last successful sync.
	SyncProxyRulesLastTimestamp = k8smetrics.NewGaugeVec(&k8smetrics.GaugeOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_last_timestamp_seconds",
		Help:      "The last time proxy rules were successfully synced",
	}, []string{LabelIPFamily})

	// SyncProxyRulesLastQueuedTimestamp is the Unix time a sync was last
	// requested. Much larger than SyncProxyRulesLastTimestamp means a hung
	// sync loop.
	SyncProxyRulesLastQueuedTimestamp = k8smetrics.NewGaugeVec(&k8smetrics.GaugeOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_last_queued_timestamp_seconds",
		Help:      "The last time a sync of proxy rules was queued",
	}, []string{LabelIPFamily})

	// NetworkProgrammingLatency is the time from an object change (the
	// EndpointSlice's endpoints.kubernetes.io/last-change-trigger-time
	// annotation) to the rules being applied. Observed once per changed
	// object in a sync. Relies on the node and control-plane clocks agreeing.
	NetworkProgrammingLatency = k8smetrics.NewHistogramVec(&k8smetrics.HistogramOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "network_programming_duration_seconds",
		Help:      "In Cluster Network Programming Latency in seconds",
		Buckets:   networkProgrammingBuckets,
	}, []string{LabelIPFamily})

	// EndpointChangesPending is the number of EndpointSlice changes not yet
	// synced.
	EndpointChangesPending = k8smetrics.NewGauge(&k8smetrics.GaugeOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_endpoint_changes_pending",
		Help:      "Pending proxy rules Endpoint changes",
	})

	// EndpointChangesTotal counts EndpointSlice changes seen.
	EndpointChangesTotal = k8smetrics.NewCounter(&k8smetrics.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_endpoint_changes_total",
		Help:      "Cumulative proxy rules Endpoint changes",
	})

	// ServiceChangesPending is the number of Service changes not yet synced.
	ServiceChangesPending = k8smetrics.NewGauge(&k8smetrics.GaugeOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_service_changes_pending",
		Help:      "Pending proxy rules Service changes",
	})

	// ServiceChangesTotal counts Service changes seen.
	ServiceChangesTotal = k8smetrics.NewCounter(&k8smetrics.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_service_changes_total",
		Help:      "Cumulative proxy rules Service changes",
	})

	// IPTablesRestoreFailuresTotal counts failed iptables-restore runs
	// (iptables and ipvs modes).
	IPTablesRestoreFailuresTotal = k8smetrics.NewCounterVec(&k8smetrics.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_iptables_restore_failures_total",
		Help:      "Cumulative proxy iptables restore failures",
	}, []string{LabelIPFamily})

	// IPTablesPartialRestoreFailuresTotal counts failed partial restores,
	// each followed by a full one.
	IPTablesPartialRestoreFailuresTotal = k8smetrics.NewCounterVec(&k8smetrics.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_iptables_partial_restore_failures_total",
		Help:      "Cumulative proxy iptables partial restore failures",
	}, []string{LabelIPFamily})

	// IPTablesRulesTotal is the number of iptables rules kube-proxy owns, per
	// table. Labels: ip_family, table.
	IPTablesRulesTotal = k8smetrics.NewGaugeVec(&k8smetrics.GaugeOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_iptables_total",
		Help:      "Total number of iptables rules owned by kube-proxy",
	}, []string{LabelIPFamily, LabelTable})

	// IPTablesRulesLastSync is the number of iptables rules written in the
	// last sync, per table. Labels: ip_family, table.
	IPTablesRulesLastSync = k8smetrics.NewGaugeVec(&k8smetrics.GaugeOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_iptables_last",
		Help:      "Number of iptables rules written by kube-proxy in last sync",
	}, []string{LabelIPFamily, LabelTable})

	// NFTablesSyncFailuresTotal counts failed nftables transactions.
	NFTablesSyncFailuresTotal = k8smetrics.NewCounterVec(&k8smetrics.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_nftables_sync_failures_total",
		Help:      "Cumulative proxy nftables sync failures",
	}, []string{LabelIPFamily})

	// NFTablesCleanupFailuresTotal counts failed deletions of stale chains.
	NFTablesCleanupFailuresTotal = k8smetrics.NewCounterVec(&k8smetrics.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_nftables_cleanup_failures_total",
		Help:      "Cumulative proxy nftables cleanup failures",
	}, []string{LabelIPFamily})

	// SyncProxyRulesNoLocalEndpointsTotal is, despite the _total suffix, a
	// gauge (as upstream): the number of services with a Local traffic policy
	// and no local endpoints. Labels (upstream's order): traffic_policy
	// ("internal", "external"), ip_family.
	SyncProxyRulesNoLocalEndpointsTotal = k8smetrics.NewGaugeVec(&k8smetrics.GaugeOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_no_local_endpoints_total",
		Help:      "Number of services with a Local traffic policy and no endpoints",
	}, []string{LabelTrafficPolicy, LabelIPFamily})

	// ProxyHealthzTotal counts /healthz answers by HTTP status code.
	ProxyHealthzTotal = k8smetrics.NewCounterVec(&k8smetrics.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "proxy_healthz_total",
		Help:      "Cumulative proxy healthz HTTP status",
	}, []string{LabelCode})

	// ProxyLivezTotal counts /livez answers by HTTP status code.
	ProxyLivezTotal = k8smetrics.NewCounterVec(&k8smetrics.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "proxy_livez_total",
		Help:      "Cumulative proxy livez HTTP status",
	}, []string{LabelCode})

	// ReconcileConntrackFlowsLatency is the duration of one conntrack
	// reconciliation (removal of stale UDP/SCTP flows).
	ReconcileConntrackFlowsLatency = k8smetrics.NewHistogramVec(&k8smetrics.HistogramOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "conntrack_reconciler_sync_duration_seconds",
		Help:      "ReconcileConntrackFlowsLatency latency in seconds",
		Buckets:   syncBuckets,
	}, []string{LabelIPFamily})

	// ReconcileConntrackFlowsDeletedEntriesTotal counts conntrack flows the
	// reconciler deleted.
	ReconcileConntrackFlowsDeletedEntriesTotal = k8smetrics.NewCounterVec(&k8smetrics.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "conntrack_reconciler_deleted_entries_total",
		Help:      "Cumulative conntrack flows deleted by conntrack reconciler",
	}, []string{LabelIPFamily})

	// NFTablesLocalhostNodePortListeners is the number of userspace
	// listeners serving localhost NodePorts in nftables mode (KEP-6032,
	// v1.37).
	NFTablesLocalhostNodePortListeners = k8smetrics.NewGaugeVec(&k8smetrics.GaugeOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "nftables_localhost_nodeport_listeners",
		Help:      "Number of localhost NodePort listeners",
	}, []string{LabelIPFamily})

	// NFTablesLocalhostNodePortListenerCreationFailuresTotal counts failures
	// to bind a localhost NodePort listener (KEP-6032, v1.37).
	NFTablesLocalhostNodePortListenerCreationFailuresTotal = k8smetrics.NewCounterVec(&k8smetrics.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "nftables_localhost_nodeport_listener_creation_failures_total",
		Help:      "Cumulative localhost NodePort listener creation failures",
	}, []string{LabelIPFamily})
)

// Packet counters kept by the kernel and read at scrape time, as upstream's
// custom collectors do. Each emits nothing until its reader is set.
var (
	// IPTablesCTStateInvalidDroppedPackets reads the nfacct counter of
	// packets dropped because conntrack marked them INVALID (iptables mode).
	IPTablesCTStateInvalidDroppedPackets = NewKernelPacketCounter(
		"kubeproxy_iptables_ct_state_invalid_dropped_packets_total",
		alpha+"packets dropped by iptables to work around conntrack problems")

	// IPTablesLocalhostNodePortsAcceptedPackets reads the nfacct counter of
	// packets accepted on localhost NodePorts (iptables mode, IPv4).
	IPTablesLocalhostNodePortsAcceptedPackets = NewKernelPacketCounter(
		"kubeproxy_iptables_localhost_nodeports_accepted_packets_total",
		alpha+"Number of packets accepted on nodeports of loopback interface")

	// NFTablesLocalhostNodePortRejectedPackets reads the nftables named
	// counters of packets rejected on localhost NodePorts (nftables mode,
	// v1.37). Labels: ip_family, protocol.
	NFTablesLocalhostNodePortRejectedPackets = NewKernelPacketCounter(
		"kubeproxy_nftables_localhost_nodeport_rejected_packets_total",
		alpha+"Number of packets rejected on localhost NodePorts. UDP and SCTP are always rejected; TCP is rejected when the localhost NodePort proxy is not running",
		LabelIPFamily, LabelProtocol)
)

// kproxy's own metrics.
var (
	// InvalidObjectsTotal counts malformed parts of Service, EndpointSlice
	// and Node objects that kproxy skipped instead of failing the sync.
	// kind is the object kind ("Service", "EndpointSlice", "Node"); reason is
	// a short fixed token, never free text, to keep cardinality bounded:
	// "invalid" for a skipped part (a port, an endpoint, an address), and
	// for an object skipped whole because the API server would refuse it
	// one of the model's Reason* categories (invalid_name,
	// invalid_namespace, invalid_port_name, invalid_label,
	// invalid_service_name_label, invalid_address_type, too_many_items, no_ports).
	// Counted by the model's Tracker, for every source; the file source
	// also counts, as reason "undecodable" (kind "other" when not one of
	// the three), each object of a file it could not use at all (no kind
	// or name, a field of the wrong type, a duplicate), which the model
	// never sees.
	InvalidObjectsTotal = newCounterVec(&k8smetrics.CounterOpts{
		Namespace: kproxyNamespace,
		Name:      "invalid_objects_total",
		Help:      "Number of malformed Service, EndpointSlice or Node parts that were skipped",
	}, []string{LabelKind, LabelReason})

	// RefusedServicePortsTotal counts service ports whose rules the kernel
	// refused: the sync that failed was repeated without them, so every
	// other service is programmed (see internal/proxy/isolate.go).
	RefusedServicePortsTotal = newCounterVec(&k8smetrics.CounterOpts{
		Namespace: kproxyNamespace,
		Name:      "sync_refused_service_ports_total",
		Help:      "Number of times a service port was left out of a sync because the kernel refused its rules",
	}, []string{LabelIPFamily})

	// RefusedServicePorts is the number of service ports left out now
	// because the kernel refused their rules; each is retried when it
	// changes or after a backoff.
	RefusedServicePorts = newGaugeVec(&k8smetrics.GaugeOpts{
		Namespace: kproxyNamespace,
		Name:      "refused_service_ports",
		Help:      "Number of service ports not programmed because the kernel refused their rules",
	}, []string{LabelIPFamily})

	// ContestedAddresses is the number of claims on a frontend (an IP,
	// protocol and port, or a node port) that a service port currently
	// loses to another one, by the kind of the losing claim ("clusterIP",
	// "externalIP", "loadBalancerIP", "nodePort"); see model/resolve.go.
	ContestedAddresses = newGaugeVec(&k8smetrics.GaugeOpts{
		Namespace: kproxyNamespace,
		Name:      "contested_addresses",
		Help:      "Number of service port claims on an address that another service port holds, by the kind of the losing claim",
	}, []string{LabelIPFamily, LabelKind})

	// ServicePorts is the number of service ports in the rules of the last
	// successful sync of a family (every mode; upstream has no such metric,
	// and in nftables mode no rule count either). Refused ones are not
	// counted (see RefusedServicePorts).
	ServicePorts = newGaugeVec(&k8smetrics.GaugeOpts{
		Namespace: kproxyNamespace,
		Name:      "service_ports",
		Help:      "Number of service ports programmed by the last successful sync",
	}, []string{LabelIPFamily})

	// IPTablesOtherBackendChains is the number of kube-proxy chains found
	// in the iptables backend kproxy does not use (checked at start and at
	// every full sync). Rules of both backends run on every packet, legacy
	// first, so anything above zero can steal service traffic; `kproxy
	// --cleanup` removes them.
	IPTablesOtherBackendChains = newGaugeVec(&k8smetrics.GaugeOpts{
		Namespace: kproxyNamespace,
		Name:      "iptables_other_backend_chains",
		Help:      "Number of kube-proxy chains found in the iptables backend kproxy does not use",
	}, []string{LabelBackend})

	// IPTablesLockWait is how long each iptables-restore waited for the
	// xtables lock that kubelet and other tools take too (legacy backend;
	// the wait is bounded, see IPTablesLockTimeoutsTotal).
	IPTablesLockWait = k8smetrics.NewHistogramVec(&k8smetrics.HistogramOpts{
		Namespace: kproxyNamespace,
		Name:      "iptables_lock_wait_seconds",
		Help:      "Time iptables-restore waited for the xtables lock",
		Buckets:   []float64{0.001, 0.01, 0.1, 0.5, 1, 2, 5},
	}, []string{LabelIPFamily})

	// IPTablesLockTimeoutsTotal counts restores that gave up waiting for
	// the xtables lock (the sync is retried, full).
	IPTablesLockTimeoutsTotal = newCounterVec(&k8smetrics.CounterOpts{
		Namespace: kproxyNamespace,
		Name:      "iptables_lock_timeouts_total",
		Help:      "Number of iptables-restore runs that gave up waiting for the xtables lock",
	}, []string{LabelIPFamily})

	// SourceFileErrorsTotal counts file-level faults of the --from-file
	// source, once per fault per read: a snapshot file missing, unreadable,
	// not a regular file, too large, empty, unparsable or cut short, or a
	// directory with no snapshot file left. The objects such a file gave
	// before are kept. reason is one of file.Reasons.
	SourceFileErrorsTotal = newCounterVec(&k8smetrics.CounterOpts{
		Namespace: kproxyNamespace,
		Name:      "source_file_errors_total",
		Help:      "Number of snapshot file faults (the file's last good objects were kept), by reason",
	}, []string{LabelReason})

	// SourceFileLastGoodTimestamp is the Unix time of the last read of the
	// --from-file source in which every file was good.
	SourceFileLastGoodTimestamp = k8smetrics.NewGauge(&k8smetrics.GaugeOpts{
		Namespace: kproxyNamespace,
		Name:      "source_file_last_good_read_timestamp_seconds",
		Help:      "The last time every snapshot file of the file source was read without a fault",
	})

	// RulesDriftTotal counts differences between the rules kproxy wrote
	// and what the kernel holds that kproxy did not cause: someone else
	// deleted, flushed or added a table, chain, rule, set, map or element
	// of kproxy's (kind "unknown": nf_tables notifications were lost, so
	// what changed is not known). Each is repaired by a full sync of the
	// family. mode is the proxy mode ("nftables", "iptables").
	RulesDriftTotal = newCounterVec(&k8smetrics.CounterOpts{
		Namespace: kproxyNamespace,
		Name:      "rules_drift_total",
		Help:      "Number of changes to kproxy's rules made by someone else, found and repaired, by kind of object",
	}, []string{LabelMode, LabelKind})

	// Info is always 1; its labels say what this kproxy runs. Set it with
	// SetInfo.
	Info = newGaugeVec(&k8smetrics.GaugeOpts{
		Namespace: kproxyNamespace,
		Name:      "info",
		Help:      "Information about the running kproxy: proxy mode, backend and version. Always 1.",
	}, []string{LabelMode, LabelBackend, LabelVersion})
)

// SetInfo sets kproxy_info to 1 for these labels and drops any previous
// series, so that only the current mode, backend and version are exported.
func SetInfo(mode, backend, version string) {
	Info.Reset()
	Info.WithLabelValues(mode, backend, version).Set(1)
}

// upstreamMetrics are upstream's kubeproxy_* metrics (component-base
// types), registered in component-base's legacy registry at start.
// Upstream registers some only in the mode that uses them; registering all
// of them is equivalent on the wire (a vector without series produces no
// output, and the unlabelled metrics are the ones upstream registers in
// every mode), but registered_metrics_total{stability_level="ALPHA"}
// counts every one of them.
func upstreamMetrics() []k8smetrics.Registerable {
	return []k8smetrics.Registerable{
		SyncProxyRulesLatency,
		SyncFullProxyRulesLatency,
		SyncPartialProxyRulesLatency,
		SyncProxyRulesLastTimestamp,
		SyncProxyRulesLastQueuedTimestamp,
		NetworkProgrammingLatency,
		EndpointChangesPending,
		EndpointChangesTotal,
		ServiceChangesPending,
		ServiceChangesTotal,
		IPTablesRestoreFailuresTotal,
		IPTablesPartialRestoreFailuresTotal,
		IPTablesRulesTotal,
		IPTablesRulesLastSync,
		NFTablesSyncFailuresTotal,
		NFTablesCleanupFailuresTotal,
		SyncProxyRulesNoLocalEndpointsTotal,
		ProxyHealthzTotal,
		ProxyLivezTotal,
		ReconcileConntrackFlowsLatency,
		ReconcileConntrackFlowsDeletedEntriesTotal,
		NFTablesLocalhostNodePortListeners,
		NFTablesLocalhostNodePortListenerCreationFailuresTotal,
	}
}

// ownMetrics are kproxy's own kproxy_* metrics, component-base metrics
// registered in its legacy registry beside upstream's, so that
// registered_metrics_total counts them.
func ownMetrics() []k8smetrics.Registerable {
	return []k8smetrics.Registerable{
		InvalidObjectsTotal,
		RefusedServicePortsTotal,
		RefusedServicePorts,
		ContestedAddresses,
		ServicePorts,
		IPTablesOtherBackendChains,
		IPTablesLockWait,
		IPTablesLockTimeoutsTotal,
		SourceFileErrorsTotal,
		SourceFileLastGoodTimestamp,
		RulesDriftTotal,
		Info,
	}
}

// ownCollectors lists what Registry holds: the kernel packet counters
// (custom collectors, as upstream's, which component-base does not count).
func ownCollectors() []prometheus.Collector {
	return []prometheus.Collector{
		IPTablesCTStateInvalidDroppedPackets,
		IPTablesLocalhostNodePortsAcceptedPackets,
		NFTablesLocalhostNodePortRejectedPackets,
	}
}

func init() {
	legacyregistry.MustRegister(upstreamMetrics()...)
	legacyregistry.MustRegister(ownMetrics()...)
}

// Register registers the kernel packet counters with reg. Registering
// twice with the same registry is harmless. Any other registration error
// means two metrics share a name, a programming error, and panics.
func Register(reg prometheus.Registerer) {
	registerAll(reg, ownCollectors())
}

func registerAll(reg prometheus.Registerer, cs []prometheus.Collector) {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) && are.ExistingCollector == c {
				continue
			}
			panic(fmt.Sprintf("registering kproxy metrics: %v", err))
		}
	}
}

// Describe sends the descriptions of every kubeproxy_ and kproxy_ metric
// /metrics serves (upstream's and kproxy's own in the legacy registry, the
// kernel packet counters in Registry), whether or not it has a series yet.
func Describe(ch chan<- *prometheus.Desc) {
	for _, m := range append(upstreamMetrics(), ownMetrics()...) {
		m.Describe(ch)
	}
	Registry.Describe(ch)
}

// Registry holds the kernel packet counters; /metrics serves it through
// Gatherer, together with component-base's legacy registry (upstream's
// kubeproxy_* metrics, kproxy's kproxy_* ones, the Go runtime and process
// metrics, see component.go).
var Registry = newDefaultRegistry()

func newDefaultRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	Register(reg)
	return reg
}

// CounterVec is a component-base counter vector (registered in the legacy
// registry, so that registered_metrics_total counts it) whose series are
// client_golang counters, as plain client_golang vectors give: callers and
// tests read them with client_golang's testutil.
type CounterVec struct{ *k8smetrics.CounterVec }

func newCounterVec(opts *k8smetrics.CounterOpts, labels []string) CounterVec {
	return CounterVec{k8smetrics.NewCounterVec(opts, labels)}
}

// WithLabelValues returns the series of these label values; a no-op
// counter while the vector is not registered (component-base's rule).
func (v CounterVec) WithLabelValues(lvs ...string) prometheus.Counter {
	// component-base returns the client_golang counter, or its no-op
	// metric, which implements prometheus.Counter too.
	return v.CounterVec.WithLabelValues(lvs...).(prometheus.Counter)
}

// GaugeVec is CounterVec's counterpart for gauges.
type GaugeVec struct{ *k8smetrics.GaugeVec }

func newGaugeVec(opts *k8smetrics.GaugeOpts, labels []string) GaugeVec {
	return GaugeVec{k8smetrics.NewGaugeVec(opts, labels)}
}

// WithLabelValues returns the series of these label values; a no-op
// gauge while the vector is not registered (component-base's rule).
func (v GaugeVec) WithLabelValues(lvs ...string) prometheus.Gauge {
	return v.GaugeVec.WithLabelValues(lvs...).(prometheus.Gauge)
}

// kernelReadTimeout bounds one read of kernel counters during a scrape (as
// upstream's nft counter listing), so a stuck netlink call cannot hang
// /metrics.
const kernelReadTimeout = 2 * time.Second

// PacketCount is one sample of a kernel packet counter: the values of the
// counter's labels, in the order given to NewKernelPacketCounter, and the
// packet count.
type PacketCount struct {
	LabelValues []string
	Packets     uint64
}

// PacketCountReader reads kernel packet counters (nfacct objects, nftables
// named counters). It is called on every scrape.
type PacketCountReader func(ctx context.Context) ([]PacketCount, error)

// KernelPacketCounter is a counter metric whose value lives in the kernel
// and is read when scraped. The proxy mode that owns the kernel object
// installs a reader with SetReader; until then it emits nothing.
type KernelPacketCounter struct {
	desc   *prometheus.Desc
	labels int

	mu   sync.RWMutex
	read PacketCountReader
}

var _ prometheus.Collector = (*KernelPacketCounter)(nil)

// NewKernelPacketCounter returns a KernelPacketCounter with the given full
// metric name, help and label names.
func NewKernelPacketCounter(name, help string, labels ...string) *KernelPacketCounter {
	return &KernelPacketCounter{
		desc:   prometheus.NewDesc(name, help, labels, nil),
		labels: len(labels),
	}
}

// SetReader installs (or, with nil, removes) the function that reads the
// kernel counters.
func (c *KernelPacketCounter) SetReader(read PacketCountReader) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.read = read
}

// Describe implements prometheus.Collector.
func (c *KernelPacketCounter) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.desc
}

// Collect implements prometheus.Collector. A failed read is logged and
// yields no sample, as upstream: a missing table (mode not in use, or not
// yet created) must not break the whole scrape.
func (c *KernelPacketCounter) Collect(ch chan<- prometheus.Metric) {
	c.mu.RLock()
	read := c.read
	c.mu.RUnlock()
	if read == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), kernelReadTimeout)
	defer cancel()
	counts, err := read(ctx)
	if err != nil {
		klog.ErrorS(err, "Failed to read kernel packet counters", "metric", c.desc.String())
		return
	}
	for _, pc := range counts {
		if len(pc.LabelValues) != c.labels {
			klog.ErrorS(nil, "Kernel packet counter has the wrong number of label values",
				"metric", c.desc.String(), "labelValues", pc.LabelValues, "want", c.labels)
			continue
		}
		m, err := prometheus.NewConstMetric(c.desc, prometheus.CounterValue, float64(pc.Packets), pc.LabelValues...)
		if err != nil {
			klog.ErrorS(err, "Failed to build kernel packet counter sample", "metric", c.desc.String())
			continue
		}
		ch <- m
	}
}
