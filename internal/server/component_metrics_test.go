package server

// Component metrics and endpoints upstream kube-proxy serves beside
// kubeproxy_*: checked through the metrics server's HTTP handlers, with the
// default gatherer (component-base's legacy registry and kproxy's own).
// The API server is an httptest server on 127.0.0.1.

import (
	"context"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	componentbaseconfigv1alpha1 "k8s.io/component-base/config/v1alpha1"
	"k8s.io/component-base/featuregate"
	"k8s.io/component-base/metrics/prometheus/slis"

	"github.com/kproxy/kproxy/internal/source/apiserver"
)

// metricType returns the "# TYPE" of a family in a text exposition, or "".
func metricType(body, name string) string {
	m := regexp.MustCompile(`(?m)^# TYPE ` + regexp.QuoteMeta(name) + ` (\w+)$`).FindStringSubmatch(body)
	if m == nil {
		return ""
	}
	return m[1]
}

// sampleValue returns the value of the sample whose name and labels start
// with prefix (e.g. `x_total{code="200"`), and whether there is one.
func sampleValue(t *testing.T, body, prefix string) (float64, bool) {
	t.Helper()
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("sample %q: %v", line, err)
		}
		return v, true
	}
	return 0, false
}

// fakeAPIServer answers every request with an empty ServiceList.
func fakeAPIServer(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"ServiceList","apiVersion":"v1","metadata":{},"items":[]}`))
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestComponentMetrics(t *testing.T) {
	addr := startMetrics(t, MetricsServerConfig{})

	// kubernetes_feature_enabled is filled by the gate's AddMetrics, as
	// upstream after validating its configuration.
	fg := featuregate.NewFeatureGate()
	if err := fg.Add(map[featuregate.Feature]featuregate.FeatureSpec{
		"KproxyTestGate": {Default: true, PreRelease: featuregate.Beta},
	}); err != nil {
		t.Fatal(err)
	}
	fg.AddMetrics()

	// The API client kproxy uses records client-go's request metrics.
	api := fakeAPIServer(t)
	host := strings.TrimPrefix(api.URL, "http://")
	client, err := apiserver.NewClient("", api.URL, componentbaseconfigv1alpha1.ClientConnectionConfiguration{ContentType: "application/json"})
	if err != nil {
		t.Fatal(err)
	}
	requests := `rest_client_requests_total{code="200",host="` + host + `",method="GET"}`
	before, _ := sampleValue(t, get(t, httpURL(addr, "/metrics")).body, requests)
	const n = 3
	for range n {
		if _, err := client.CoreV1().Services("default").List(context.Background(), metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	body := get(t, httpURL(addr, "/metrics")).body
	after, ok := sampleValue(t, body, requests)
	if !ok {
		t.Fatalf("/metrics lacks %s", requests)
	}
	if after-before != n {
		t.Errorf("%s moved by %v after %d requests, want %d", requests, after-before, n, n)
	}
	// Families, types and label names as upstream kube-proxy v1.37.2.
	for name, want := range map[string]string{
		"rest_client_requests_total":                        "counter",
		"rest_client_request_duration_seconds":              "histogram",
		"kubernetes_build_info":                             "gauge",
		"kubernetes_feature_enabled":                        "gauge",
		"registered_metrics_total":                          "counter",
		"go_goroutines":                                     "gauge",
		"process_start_time_seconds":                        "gauge",
		"kubeproxy_sync_proxy_rules_endpoint_changes_total": "counter",
	} {
		if got := metricType(body, name); got != want {
			t.Errorf("# TYPE %s = %q, want %q", name, got, want)
		}
	}
	for _, prefix := range []string{
		`rest_client_request_duration_seconds_bucket{host="` + host + `",verb="GET",le=`,
		`kubernetes_build_info{build_date=`,
		`kubernetes_feature_enabled{name="KproxyTestGate",stage="BETA"} 1`,
		`registered_metrics_total{deprecated_version="",stability_level="STABLE"}`,
	} {
		if _, ok := sampleValue(t, body, prefix); !ok {
			t.Errorf("/metrics has no sample %s", prefix)
		}
	}
	// The Go and process collectors are upstream's (component-base's,
	// with the runtime/metrics set), served once.
	if n := strings.Count(body, "\n# TYPE go_goroutines "); n != 1 {
		t.Errorf("go_goroutines served %d times, want 1", n)
	}
	if metricType(body, "go_sched_gomaxprocs_threads") != "gauge" {
		t.Errorf("/metrics lacks upstream's runtime/metrics Go collector (go_sched_gomaxprocs_threads)")
	}
}

// TestSLIsEndpoint: /metrics/slis shows the healthz check results, as
// upstream's; DELETE resets them.
func TestSLIsEndpoint(t *testing.T) {
	addr := startMetrics(t, MetricsServerConfig{})
	slis.ResetHealthMetrics()
	t.Cleanup(slis.ResetHealthMetrics)
	const success = `kubernetes_healthchecks_total{name="ping",status="success",type="healthz"}`

	resp := get(t, httpURL(addr, "/metrics/slis"))
	if resp.code != http.StatusOK {
		t.Fatalf("/metrics/slis: code %d", resp.code)
	}
	if _, ok := sampleValue(t, resp.body, success); ok {
		t.Fatalf("%s before any /healthz request:\n%s", success, resp.body)
	}
	for range 2 {
		get(t, httpURL(addr, "/healthz"))
	}
	get(t, httpURL(addr, "/healthz/ping")) // not a recorded check upstream
	body := get(t, httpURL(addr, "/metrics/slis")).body
	if v, _ := sampleValue(t, body, success); v != 2 {
		t.Errorf("%s = %v, want 2:\n%s", success, v, body)
	}
	if v, ok := sampleValue(t, body, `kubernetes_healthcheck{name="ping",type="healthz"}`); !ok || v != 1 {
		t.Errorf("kubernetes_healthcheck{name=ping} = %v (present %v), want 1", v, ok)
	}
	for name, want := range map[string]string{"kubernetes_healthcheck": "gauge", "kubernetes_healthchecks_total": "counter"} {
		if got := metricType(body, name); got != want {
			t.Errorf("# TYPE %s = %q, want %q", name, got, want)
		}
	}

	if resp := do(t, http.MethodDelete, httpURL(addr, "/metrics/slis"), nil); resp.code != http.StatusOK {
		t.Fatalf("DELETE /metrics/slis: code %d", resp.code)
	}
	if _, ok := sampleValue(t, get(t, httpURL(addr, "/metrics/slis")).body, success); ok {
		t.Errorf("%s still present after DELETE", success)
	}
}
