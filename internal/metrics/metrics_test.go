package metrics

import (
	"context"
	"errors"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	k8smetrics "k8s.io/component-base/metrics"
)

// want lists every kubeproxy_ metric of upstream v1.36's metrics reference
// (kubernetes.io "Metrics (v1.36)", component kube-proxy) plus the v1.37
// additions of KEP-6032, and kproxy's own (component-base metrics too, so
// ALPHA as well). help is without the "[ALPHA] " prefix, which is checked
// separately.
var want = []struct {
	name   string
	typ    dto.MetricType
	help   string
	labels []string
	alpha  bool
}{
	{"kubeproxy_conntrack_reconciler_deleted_entries_total", dto.MetricType_COUNTER, "Cumulative conntrack flows deleted by conntrack reconciler", []string{"ip_family"}, true},
	{"kubeproxy_conntrack_reconciler_sync_duration_seconds", dto.MetricType_HISTOGRAM, "ReconcileConntrackFlowsLatency latency in seconds", []string{"ip_family"}, true},
	{"kubeproxy_iptables_ct_state_invalid_dropped_packets_total", dto.MetricType_COUNTER, "packets dropped by iptables to work around conntrack problems", nil, true},
	{"kubeproxy_iptables_localhost_nodeports_accepted_packets_total", dto.MetricType_COUNTER, "Number of packets accepted on nodeports of loopback interface", nil, true},
	{"kubeproxy_network_programming_duration_seconds", dto.MetricType_HISTOGRAM, "In Cluster Network Programming Latency in seconds", []string{"ip_family"}, true},
	{"kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total", dto.MetricType_COUNTER, "Cumulative localhost NodePort listener creation failures", []string{"ip_family"}, true},
	{"kubeproxy_nftables_localhost_nodeport_listeners", dto.MetricType_GAUGE, "Number of localhost NodePort listeners", []string{"ip_family"}, true},
	{"kubeproxy_nftables_localhost_nodeport_rejected_packets_total", dto.MetricType_COUNTER, "Number of packets rejected on localhost NodePorts. UDP and SCTP are always rejected; TCP is rejected when the localhost NodePort proxy is not running", []string{"ip_family", "protocol"}, true},
	{"kubeproxy_proxy_healthz_total", dto.MetricType_COUNTER, "Cumulative proxy healthz HTTP status", []string{"code"}, true},
	{"kubeproxy_proxy_livez_total", dto.MetricType_COUNTER, "Cumulative proxy livez HTTP status", []string{"code"}, true},
	{"kubeproxy_sync_full_proxy_rules_duration_seconds", dto.MetricType_HISTOGRAM, "SyncProxyRules latency in seconds for full resyncs", []string{"ip_family"}, true},
	{"kubeproxy_sync_partial_proxy_rules_duration_seconds", dto.MetricType_HISTOGRAM, "SyncProxyRules latency in seconds for partial resyncs", []string{"ip_family"}, true},
	{"kubeproxy_sync_proxy_rules_duration_seconds", dto.MetricType_HISTOGRAM, "SyncProxyRules latency in seconds", []string{"ip_family"}, true},
	{"kubeproxy_sync_proxy_rules_endpoint_changes_pending", dto.MetricType_GAUGE, "Pending proxy rules Endpoint changes", nil, true},
	{"kubeproxy_sync_proxy_rules_endpoint_changes_total", dto.MetricType_COUNTER, "Cumulative proxy rules Endpoint changes", nil, true},
	{"kubeproxy_sync_proxy_rules_iptables_last", dto.MetricType_GAUGE, "Number of iptables rules written by kube-proxy in last sync", []string{"ip_family", "table"}, true},
	{"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total", dto.MetricType_COUNTER, "Cumulative proxy iptables partial restore failures", []string{"ip_family"}, true},
	{"kubeproxy_sync_proxy_rules_iptables_restore_failures_total", dto.MetricType_COUNTER, "Cumulative proxy iptables restore failures", []string{"ip_family"}, true},
	{"kubeproxy_sync_proxy_rules_iptables_total", dto.MetricType_GAUGE, "Total number of iptables rules owned by kube-proxy", []string{"ip_family", "table"}, true},
	{"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", dto.MetricType_GAUGE, "The last time a sync of proxy rules was queued", []string{"ip_family"}, true},
	{"kubeproxy_sync_proxy_rules_last_timestamp_seconds", dto.MetricType_GAUGE, "The last time proxy rules were successfully synced", []string{"ip_family"}, true},
	{"kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total", dto.MetricType_COUNTER, "Cumulative proxy nftables cleanup failures", []string{"ip_family"}, true},
	{"kubeproxy_sync_proxy_rules_nftables_sync_failures_total", dto.MetricType_COUNTER, "Cumulative proxy nftables sync failures", []string{"ip_family"}, true},
	{"kubeproxy_sync_proxy_rules_no_local_endpoints_total", dto.MetricType_GAUGE, "Number of services with a Local traffic policy and no endpoints", []string{"ip_family", "traffic_policy"}, true},
	{"kubeproxy_sync_proxy_rules_service_changes_pending", dto.MetricType_GAUGE, "Pending proxy rules Service changes", nil, true},
	{"kubeproxy_sync_proxy_rules_service_changes_total", dto.MetricType_COUNTER, "Cumulative proxy rules Service changes", nil, true},
	{"kproxy_contested_addresses", dto.MetricType_GAUGE, "Number of service port claims on an address that another service port holds, by the kind of the losing claim", []string{"ip_family", "kind"}, true},
	{"kproxy_info", dto.MetricType_GAUGE, "Information about the running kproxy: proxy mode, backend and version. Always 1.", []string{"backend", "mode", "version"}, true},
	{"kproxy_invalid_objects_total", dto.MetricType_COUNTER, "Number of malformed Service, EndpointSlice or Node parts that were skipped", []string{"kind", "reason"}, true},
	{"kproxy_source_file_errors_total", dto.MetricType_COUNTER, "Number of snapshot file faults (the file's last good objects were kept), by reason", []string{"reason"}, true},
	{"kproxy_source_file_last_good_read_timestamp_seconds", dto.MetricType_GAUGE, "The last time every snapshot file of the file source was read without a fault", nil, true},
}

// registerForTest registers every kubeproxy_ and kproxy_ metric with reg:
// the kernel packet counters as Register does, and upstream's and
// kproxy's own, which the package registered in component-base's legacy
// registry.
func registerForTest(reg prometheus.Registerer) {
	Register(reg)
	for _, m := range append(upstreamMetrics(), ownMetrics()...) {
		reg.MustRegister(m)
	}
}

// TestRegisteredMetricsTotal: upstream's metrics and kproxy's own count in
// component-base's registered_metrics_total, as upstream's count there.
func TestRegisteredMetricsTotal(t *testing.T) {
	mfs, err := Gatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "registered_metrics_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "stability_level" && l.GetValue() == "ALPHA" {
					if v, n := m.GetCounter().GetValue(), len(upstreamMetrics())+len(ownMetrics()); v < float64(n) {
						t.Errorf("registered_metrics_total{stability_level=\"ALPHA\"} = %v, want at least the %d kubeproxy_ and kproxy_ metrics", v, n)
					}
					return
				}
			}
		}
	}
	t.Fatal("no registered_metrics_total{stability_level=\"ALPHA\"}")
}

// touchAll gives every vector one series and every kernel counter a reader,
// so that each metric shows up in a gather.
func touchAll() {
	for _, h := range []*k8smetrics.HistogramVec{SyncProxyRulesLatency, SyncFullProxyRulesLatency, SyncPartialProxyRulesLatency, NetworkProgrammingLatency, ReconcileConntrackFlowsLatency} {
		h.WithLabelValues("IPv4").Observe(0.5)
	}
	for _, c := range []*k8smetrics.CounterVec{IPTablesRestoreFailuresTotal, IPTablesPartialRestoreFailuresTotal, NFTablesSyncFailuresTotal, NFTablesCleanupFailuresTotal, ReconcileConntrackFlowsDeletedEntriesTotal, NFTablesLocalhostNodePortListenerCreationFailuresTotal} {
		c.WithLabelValues("IPv4").Inc()
	}
	for _, g := range []*k8smetrics.GaugeVec{SyncProxyRulesLastTimestamp, SyncProxyRulesLastQueuedTimestamp, NFTablesLocalhostNodePortListeners} {
		g.WithLabelValues("IPv4").Set(1)
	}
	IPTablesRulesTotal.WithLabelValues("IPv4", "nat").Set(10)
	IPTablesRulesLastSync.WithLabelValues("IPv4", "filter").Set(3)
	SyncProxyRulesNoLocalEndpointsTotal.WithLabelValues("internal", "IPv4").Set(1)
	ProxyHealthzTotal.WithLabelValues("200").Inc()
	ProxyLivezTotal.WithLabelValues("503").Inc()
	InvalidObjectsTotal.WithLabelValues("EndpointSlice", "bad_address").Inc()
	SourceFileErrorsTotal.WithLabelValues("empty").Inc()
	ContestedAddresses.WithLabelValues("IPv4", "nodePort").Set(1)
	SetInfo("nftables", "nft", "v0.0.0-test")
	one := func(lv ...string) PacketCountReader {
		return func(context.Context) ([]PacketCount, error) {
			return []PacketCount{{LabelValues: lv, Packets: 1}}, nil
		}
	}
	IPTablesCTStateInvalidDroppedPackets.SetReader(one())
	IPTablesLocalhostNodePortsAcceptedPackets.SetReader(one())
	NFTablesLocalhostNodePortRejectedPackets.SetReader(one("IPv4", "UDP"))
}

func resetReaders() {
	IPTablesCTStateInvalidDroppedPackets.SetReader(nil)
	IPTablesLocalhostNodePortsAcceptedPackets.SetReader(nil)
	NFTablesLocalhostNodePortRejectedPackets.SetReader(nil)
}

func TestMetricsNamesHelpLabels(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	registerForTest(reg)
	touchAll()
	t.Cleanup(resetReaders)

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	got := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		got[mf.GetName()] = mf
	}
	if len(got) != len(want) {
		var names []string
		for n := range got {
			names = append(names, n)
		}
		sort.Strings(names)
		t.Errorf("gathered %d families, want %d: %v", len(got), len(want), names)
	}
	for _, w := range want {
		t.Run(w.name, func(t *testing.T) {
			mf, ok := got[w.name]
			if !ok {
				t.Fatalf("metric %s not gathered", w.name)
			}
			if mf.GetType() != w.typ {
				t.Errorf("type = %v, want %v", mf.GetType(), w.typ)
			}
			wantHelp := w.help
			if w.alpha {
				wantHelp = "[ALPHA] " + wantHelp
			}
			if mf.GetHelp() != wantHelp {
				t.Errorf("help = %q, want %q", mf.GetHelp(), wantHelp)
			}
			for _, m := range mf.GetMetric() {
				var names []string
				for _, lp := range m.GetLabel() {
					names = append(names, lp.GetName())
				}
				if diff := cmp.Diff(w.labels, names); diff != "" {
					t.Errorf("label names (-want +got):\n%s", diff)
				}
			}
		})
	}
}

func TestHistogramBuckets(t *testing.T) {
	exp := []float64{0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096, 8.192, 16.384}
	netprog := []float64{0, 0.25, 0.5}
	for i := 1; i <= 59; i++ {
		netprog = append(netprog, float64(i))
	}
	for i := 60; i <= 115; i += 5 {
		netprog = append(netprog, float64(i))
	}
	for i := 120; i <= 300; i += 30 {
		netprog = append(netprog, float64(i))
	}
	for _, tc := range []struct {
		name string
		h    *k8smetrics.HistogramVec
		want []float64
	}{
		{"sync_proxy_rules_duration_seconds", SyncProxyRulesLatency, exp},
		{"sync_full_proxy_rules_duration_seconds", SyncFullProxyRulesLatency, exp},
		{"sync_partial_proxy_rules_duration_seconds", SyncPartialProxyRulesLatency, exp},
		{"conntrack_reconciler_sync_duration_seconds", ReconcileConntrackFlowsLatency, exp},
		{"network_programming_duration_seconds", NetworkProgrammingLatency, netprog},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			reg.MustRegister(tc.h)
			tc.h.WithLabelValues("IPv6").Observe(1)
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			var got []float64
			for _, b := range mfs[0].GetMetric()[0].GetHistogram().GetBucket() {
				got = append(got, b.GetUpperBound())
			}
			approx := cmp.Comparer(func(a, b float64) bool { d := a - b; return d < 1e-9 && d > -1e-9 })
			if diff := cmp.Diff(tc.want, got, approx); diff != "" {
				t.Errorf("buckets (-want +got):\n%s", diff)
			}
		})
	}
}

// TestExposition pins the exact text a scraper sees for a few metrics, the
// way upstream's own tests compare against exposition text.
func TestExposition(t *testing.T) {
	reg := prometheus.NewRegistry()
	registerForTest(reg)
	ProxyHealthzTotal.Reset()
	ProxyHealthzTotal.WithLabelValues("200").Add(2)
	ProxyHealthzTotal.WithLabelValues("503").Inc()
	SyncProxyRulesNoLocalEndpointsTotal.Reset()
	SyncProxyRulesNoLocalEndpointsTotal.WithLabelValues("external", "IPv6").Set(4)
	NFTablesLocalhostNodePortRejectedPackets.SetReader(func(context.Context) ([]PacketCount, error) {
		return []PacketCount{
			{LabelValues: []string{"IPv4", "UDP"}, Packets: 7},
			{LabelValues: []string{"IPv4", "SCTP"}, Packets: 3},
		}, nil
	})
	t.Cleanup(resetReaders)

	const text = `
# HELP kubeproxy_proxy_healthz_total [ALPHA] Cumulative proxy healthz HTTP status
# TYPE kubeproxy_proxy_healthz_total counter
kubeproxy_proxy_healthz_total{code="200"} 2
kubeproxy_proxy_healthz_total{code="503"} 1
# HELP kubeproxy_sync_proxy_rules_no_local_endpoints_total [ALPHA] Number of services with a Local traffic policy and no endpoints
# TYPE kubeproxy_sync_proxy_rules_no_local_endpoints_total gauge
kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv6",traffic_policy="external"} 4
# HELP kubeproxy_nftables_localhost_nodeport_rejected_packets_total [ALPHA] Number of packets rejected on localhost NodePorts. UDP and SCTP are always rejected; TCP is rejected when the localhost NodePort proxy is not running
# TYPE kubeproxy_nftables_localhost_nodeport_rejected_packets_total counter
kubeproxy_nftables_localhost_nodeport_rejected_packets_total{ip_family="IPv4",protocol="SCTP"} 3
kubeproxy_nftables_localhost_nodeport_rejected_packets_total{ip_family="IPv4",protocol="UDP"} 7
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(text),
		"kubeproxy_proxy_healthz_total",
		"kubeproxy_sync_proxy_rules_no_local_endpoints_total",
		"kubeproxy_nftables_localhost_nodeport_rejected_packets_total"); err != nil {
		t.Error(err)
	}
}

func TestKernelPacketCounter(t *testing.T) {
	for _, tc := range []struct {
		name   string
		labels []string
		read   PacketCountReader
		want   int // samples
	}{
		{name: "no reader", want: 0},
		{name: "read error yields nothing", read: func(context.Context) ([]PacketCount, error) {
			return nil, errors.New("table not found")
		}, want: 0},
		{name: "one sample", read: func(context.Context) ([]PacketCount, error) {
			return []PacketCount{{Packets: 42}}, nil
		}, want: 1},
		{name: "sample with wrong label count skipped", labels: []string{"ip_family"}, read: func(context.Context) ([]PacketCount, error) {
			return []PacketCount{{LabelValues: []string{"IPv4"}, Packets: 1}, {Packets: 2}}, nil
		}, want: 1},
		{name: "reader gets a deadline", read: func(ctx context.Context) ([]PacketCount, error) {
			if _, ok := ctx.Deadline(); !ok {
				return nil, errors.New("no deadline")
			}
			return []PacketCount{{Packets: 1}}, nil
		}, want: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewKernelPacketCounter("test_packets_total", "help", tc.labels...)
			c.SetReader(tc.read)
			if got := testutil.CollectAndCount(c); got != tc.want {
				t.Errorf("samples = %d, want %d", got, tc.want)
			}
		})
	}
	c := NewKernelPacketCounter("test_packets_total", "help")
	c.SetReader(func(context.Context) ([]PacketCount, error) { return []PacketCount{{Packets: 42}}, nil })
	if got := testutil.ToFloat64(c); got != 42 {
		t.Errorf("value = %v, want 42", got)
	}
}

func TestSetInfoKeepsOneSeries(t *testing.T) {
	SetInfo("iptables", "legacy", "v1")
	SetInfo("iptables", "nft", "v1")
	if n := testutil.CollectAndCount(Info); n != 1 {
		t.Fatalf("kproxy_info has %d series, want 1", n)
	}
	if v := testutil.ToFloat64(Info.WithLabelValues("iptables", "nft", "v1")); v != 1 {
		t.Errorf("kproxy_info{backend=nft} = %v, want 1", v)
	}
}

func TestRegisterIsIdempotent(t *testing.T) {
	reg := prometheus.NewRegistry()
	Register(reg)
	Register(reg) // must not panic
	// A different collector with a taken name is a real conflict.
	defer func() {
		if recover() == nil {
			t.Error("Register did not panic on a conflicting collector")
		}
	}()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "kproxy_conflict_total", Help: "x"}))
	conflicting := prometheus.NewCounter(prometheus.CounterOpts{Name: "kproxy_conflict_total", Help: "x"})
	registerAll(reg, []prometheus.Collector{conflicting})
}

// TestDefaultRegistry: what /metrics serves holds kproxy's metrics and
// upstream's component metrics (legacyregistry), each once.
func TestDefaultRegistry(t *testing.T) {
	mfs, err := Gatherer.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, n := range []string{
		"go_goroutines",
		"process_start_time_seconds",
		"kubeproxy_sync_proxy_rules_endpoint_changes_total",
		"kubeproxy_sync_proxy_rules_service_changes_pending",
		"kubernetes_build_info",
		"registered_metrics_total",
		"kproxy_source_file_last_good_read_timestamp_seconds",
	} {
		if !names[n] {
			t.Errorf("default Registry lacks %s", n)
		}
	}
}
