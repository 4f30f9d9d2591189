package e2erun

import (
	"math"
	"strings"
	"testing"
)

// Two nodes' scrapes, one series each, with other lines between.
const scrape = `== node1
# HELP kubeproxy_network_programming_duration_seconds In Cluster Network Programming Latency in seconds
# TYPE kubeproxy_network_programming_duration_seconds histogram
kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="0.5"} 2
kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="1"} 6
kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="2"} 9
kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="+Inf"} 10
kubeproxy_network_programming_duration_seconds_sum{ip_family="IPv4"} 9.5
kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"} 10
kubeproxy_sync_proxy_rules_duration_seconds_bucket{le="1"} 99
== node2
kubeproxy_network_programming_duration_seconds_bucket{le="0.5"} 0
kubeproxy_network_programming_duration_seconds_bucket{le="1"} 4
kubeproxy_network_programming_duration_seconds_bucket{le="2"} 9
kubeproxy_network_programming_duration_seconds_bucket{le="+Inf"} 10
kubeproxy_network_programming_duration_seconds_sum 10.5
`

func TestLatencyHistogram(t *testing.T) {
	h, err := ReadHistogram(strings.NewReader(scrape), LatencyMetric)
	if err != nil {
		t.Fatal(err)
	}
	// Summed: ≤0.5: 2, ≤1: 10, ≤2: 18, +Inf: 20.
	if h.Total() != 20 || len(h.Bounds) != 4 || h.Counts[1] != 10 || h.Counts[2] != 18 || h.Mean() != 1 {
		t.Fatalf("histogram %+v", h)
	}
	for _, tc := range []struct{ q, want float64 }{
		{0.05, 0.25},      // rank 1: 1 of 2 into [0, 0.5]
		{0.5, 1},          // rank 10: the top of (0.5, 1]
		{0.75, 1 + 5.0/8}, // rank 15: 5 of 8 into (1, 2]
		{0.99, 2},         // rank 19.8: in +Inf, the highest finite bound
	} {
		if got := h.Quantile(tc.q); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("Quantile(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	if _, err := ReadHistogram(strings.NewReader("kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"1\"} 9\n"), LatencyMetric); err == nil {
		t.Error("a scrape without the histogram was accepted")
	}
	if _, err := ReadHistogram(strings.NewReader(LatencyMetric+"_bucket{le=\"1\"} 9\n"), LatencyMetric); err == nil {
		t.Error("a histogram without its +Inf bucket was accepted")
	}
}
