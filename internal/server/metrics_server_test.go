package server

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"
)

// startMetrics runs a MetricsServer on 127.0.0.1 and returns its address.
func startMetrics(t *testing.T, cfg MetricsServerConfig) string {
	t.Helper()
	tn := newTestNet()
	cfg.BindAddress = "127.0.0.1:10249"
	cfg.Listen = tn.listen
	runServer(t, NewMetricsServer(cfg).Run)
	return tn.waitListen(t, cfg.BindAddress)
}

func TestMetricsServer(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "kproxy_test_requests_total", Help: "test"})
	reg.MustRegister(c)
	c.Add(3)

	var mode atomic.Value
	mode.Store("iptables")
	type cfg struct {
		Mode string `json:"mode"`
	}

	addr := startMetrics(t, MetricsServerConfig{
		Gatherer:  reg,
		ProxyMode: func() string { return mode.Load().(string) },
		Configz:   func() any { return cfg{Mode: "iptables"} },
	})

	for _, tc := range []struct {
		path     string
		wantCode int
		wantCT   string
		wantBody string // exact, unless contains is set
		contains string
	}{
		{path: "/healthz", wantCode: 200, wantCT: "text/plain; charset=utf-8", wantBody: "ok"},
		{path: "/healthz/ping", wantCode: 200, wantCT: "text/plain; charset=utf-8", wantBody: "ok"},
		{path: "/healthz?verbose", wantCode: 200, wantCT: "text/plain; charset=utf-8", wantBody: "[+]ping ok\nhealthz check passed\n"},
		{path: "/proxyMode", wantCode: 200, wantCT: "text/plain; charset=utf-8", wantBody: "iptables"},
		{path: "/configz", wantCode: 200, wantCT: "application/json", wantBody: `{"kubeproxy.config.k8s.io":{"mode":"iptables"}}`},
		{path: "/metrics", wantCode: 200, contains: "\nkproxy_test_requests_total 3\n"},
		{path: "/debug/pprof/", wantCode: 404},
		{path: "/debug/flags/v", wantCode: 404},
		{path: "/livez", wantCode: 404},
	} {
		t.Run(tc.path, func(t *testing.T) {
			resp := get(t, httpURL(addr, tc.path))
			if resp.code != tc.wantCode {
				t.Fatalf("code %d, want %d; body %q", resp.code, tc.wantCode, resp.body)
			}
			if tc.wantCT != "" {
				if ct := resp.header.Get("Content-Type"); ct != tc.wantCT {
					t.Errorf("Content-Type %q, want %q", ct, tc.wantCT)
				}
				if got := resp.header.Get("X-Content-Type-Options"); got != "nosniff" {
					t.Errorf("X-Content-Type-Options %q, want nosniff", got)
				}
			}
			switch {
			case tc.contains != "":
				if !strings.Contains(resp.body, tc.contains) {
					t.Errorf("body lacks %q:\n%s", tc.contains, resp.body)
				}
			case tc.wantCode == 200:
				if diff := cmp.Diff(tc.wantBody, resp.body); diff != "" {
					t.Errorf("body (-want +got):\n%s", diff)
				}
			}
		})
	}

	// /proxyMode is computed per request, so it can report facts learnt
	// after start.
	mode.Store("nftables")
	if got := get(t, httpURL(addr, "/proxyMode")).body; got != "nftables" {
		t.Errorf("/proxyMode after change = %q", got)
	}
}

// TestProxyModeBackend: the body stays upstream's (the mode alone, which
// scripts compare); the iptables backend is in a header, and in the body
// only when asked with ?verbose.
func TestProxyModeBackend(t *testing.T) {
	addr := startMetrics(t, MetricsServerConfig{
		ProxyMode:    func() string { return "iptables" },
		ProxyBackend: func() string { return "legacy" },
	})
	resp := get(t, httpURL(addr, "/proxyMode"))
	if resp.body != "iptables" {
		t.Errorf("/proxyMode body %q, want iptables", resp.body)
	}
	if h := resp.header.Get("X-Kproxy-Backend"); h != "legacy" {
		t.Errorf("X-Kproxy-Backend %q, want legacy", h)
	}
	if got := get(t, httpURL(addr, "/proxyMode?verbose")).body; got != "iptables (backend: legacy)" {
		t.Errorf("/proxyMode?verbose = %q", got)
	}
}

func TestMetricsServerDefaultRegistry(t *testing.T) {
	addr := startMetrics(t, MetricsServerConfig{})
	resp := get(t, httpURL(addr, "/metrics"))
	for _, want := range []string{"# TYPE go_goroutines gauge", "kubeproxy_sync_proxy_rules_endpoint_changes_total"} {
		if !strings.Contains(resp.body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if got := get(t, httpURL(addr, "/configz")).body; got != "{}" {
		t.Errorf("/configz without config = %q, want {}", got)
	}
}

func TestMetricsServerProfiling(t *testing.T) {
	addr := startMetrics(t, MetricsServerConfig{EnableProfiling: true})
	for _, tc := range []struct {
		method   string
		path     string
		body     string
		wantCode int
		wantBody string
	}{
		{method: "GET", path: "/debug/pprof/", wantCode: 200},
		{method: "GET", path: "/debug/pprof/cmdline", wantCode: 200},
		{method: "GET", path: "/debug/pprof/goroutine?debug=1", wantCode: 200},
		{method: "GET", path: "/debug/flags/v", wantCode: http.StatusNotAcceptable, wantBody: "unsupported http method\n"},
		{method: "PUT", path: "/debug/flags/v", body: "many", wantCode: http.StatusBadRequest},
		{method: "PUT", path: "/debug/flags/v", body: "4", wantCode: 200, wantBody: "successfully set klog.logging.verbosity to 4\n"},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			resp := do(t, tc.method, httpURL(addr, tc.path), strings.NewReader(tc.body))
			if resp.code != tc.wantCode {
				t.Fatalf("code %d, want %d; body %q", resp.code, tc.wantCode, resp.body)
			}
			if tc.wantBody != "" && resp.body != tc.wantBody {
				t.Errorf("body %q, want %q", resp.body, tc.wantBody)
			}
		})
	}
	if !klog.V(4).Enabled() {
		t.Error("PUT /debug/flags/v 4 did not raise klog verbosity")
	}
	// Put verbosity back for the other tests.
	if resp := do(t, "PUT", httpURL(addr, "/debug/flags/v"), strings.NewReader("0")); resp.code != 200 {
		t.Errorf("resetting verbosity: %d %s", resp.code, resp.body)
	}
	if klog.V(1).Enabled() {
		t.Error("PUT /debug/flags/v 0 did not lower klog verbosity")
	}
}
