package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/server"
)

// TestNoLocalEndpointsMetricLabels reads
// kubeproxy_sync_proxy_rules_no_local_endpoints_total through /metrics as a
// scraper does: traffic_policy carries the policy and ip_family the family,
// not the other way round.
func TestNoLocalEndpointsMetricLabels(t *testing.T) {
	metrics.SyncProxyRulesNoLocalEndpointsTotal.Reset()
	t.Cleanup(metrics.SyncProxyRulesNoLocalEndpointsTotal.Reset)

	l, tr, b, _, _, _ := setup(t)
	b.res = &Result{NoLocalEndpoints: map[string]int{"internal": 3, "external": 5}}
	tr.Synced()
	if err := l.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}

	srv := httptest.NewServer(server.NewMetricsServer(server.MetricsServerConfig{}).Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "kubeproxy_sync_proxy_rules_no_local_endpoints_total{") {
			got = append(got, line)
		}
	}
	want := []string{
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="external"} 5`,
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="internal"} 3`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("/metrics has\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
