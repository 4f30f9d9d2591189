package harness

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestStat(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want Stat
	}{
		{nil, Stat{}},
		{[]float64{3}, Stat{3, 3, 3, 1}},
		{[]float64{5, 1, 3}, Stat{3, 1, 5, 3}},
		{[]float64{4, 1, 2, 3}, Stat{2.5, 1, 4, 4}},
		{[]float64{-1, 2}, Stat{2, 2, 2, 1}}, // -1: a figure that could not be read
	} {
		if got := stat(tc.in); got != tc.want {
			t.Errorf("stat(%v) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

func TestParseMetrics(t *testing.T) {
	m, err := parseMetrics(strings.NewReader(`# HELP x y
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"} 3
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv6"} 2
kubeproxy_sync_proxy_rules_duration_seconds_sum 1.5e-3
garbage
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Sum(mSync + "_count"); got != 5 {
		t.Errorf("Sum = %v, want 5", got)
	}
	if got := m.Series(mSync + "_count"); len(got) != 2 || got[`ip_family="IPv6"}`] != 2 {
		t.Errorf("Series = %v", got)
	}
	if got := m.Sum(mSync + "_sum"); got != 0.0015 {
		t.Errorf("unlabelled Sum = %v", got)
	}
}

func TestFields(t *testing.T) {
	msg, kv := fields(`I1203 16:04:46.485139   24660 netlink.go:134] "Applied nftables transaction" family="ip" tables=["kube-proxy-s0"] operations=2 messages=2 bytes=120 elapsed="339.577µs" lowerSeconds=0.000106009 kernelSeconds=0.000233838`)
	if msg != "Applied nftables transaction" || kv["bytes"] != "120" || kv["kernelSeconds"] != "0.000233838" || kv["family"] != "ip" {
		t.Errorf("fields = %q %v", msg, kv)
	}
}

func TestHistQuantile(t *testing.T) {
	parse := func(s string) Metrics {
		m, err := parseMetrics(strings.NewReader(s))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	// Two families; before the soak 10 observations all ≤ 0.01.
	before := parse(`x_bucket{ip_family="IPv4",le="0.01"} 10
x_bucket{ip_family="IPv4",le="0.1"} 10
x_bucket{ip_family="IPv4",le="1"} 10
x_bucket{ip_family="IPv4",le="+Inf"} 10
`)
	// Then 100 more: 90 ≤ 0.01, 8 in (0.01, 0.1], 1 in (0.1, 1], 1 beyond.
	after := parse(`x_bucket{ip_family="IPv4",le="0.01"} 60
x_bucket{ip_family="IPv4",le="0.1"} 66
x_bucket{ip_family="IPv4",le="1"} 67
x_bucket{ip_family="IPv4",le="+Inf"} 67
x_bucket{le="0.01",ip_family="IPv6"} 40
x_bucket{le="0.1",ip_family="IPv6"} 42
x_bucket{le="1",ip_family="IPv6"} 42
x_bucket{le="+Inf",ip_family="IPv6"} 43
`)
	for _, tc := range []struct {
		q    float64
		want float64
	}{{0.5, 0.01}, {0.9, 0.01}, {0.95, 0.1}, {0.98, 0.1}, {0.99, 1}, {1, math.Inf(1)}} {
		if got := histQuantile(before, after, "x", tc.q); got != tc.want {
			t.Errorf("q%v = %v, want %v", tc.q, got, tc.want)
		}
	}
	if got := histQuantile(after, after, "x", 0.99); got != 0 {
		t.Errorf("nothing observed: %v, want 0", got)
	}
}

func TestSoakReport(t *testing.T) {
	r := &Report{Soak: []SoakResult{{
		Services: 10, Endpoints: 100, Proxy: "kproxy", Mode: "nftables", Changes: 50, Seconds: 60,
		RSSSettledMiB: 100, RSSMaxMiB: 130, RSSEndMiB: 105, HeapSettledMiB: 20, HeapEndMiB: 21,
		NPLMean: 0.012, NPLP99: math.Inf(1),
		Samples: []SoakSample{{Seconds: 0, RSSMiB: 100}, {Seconds: 30, RSSMiB: 130}, {Seconds: 60, RSSMiB: 105}},
	}}}
	var b strings.Builder
	Markdown(&b, r)
	if !strings.Contains(b.String(), "| kproxy | nftables | 10 (100) | 50 over 60 | 100 | 130 | 105 | 1.05 | 20 → 21 |") ||
		!strings.Contains(b.String(), "12 / beyond the last bucket") {
		t.Errorf("soak table:\n%s", b.String())
	}
	svg := soakSVG(r.Soak)
	if !strings.Contains(svg, "<polyline points=") || strings.Count(svg, ",") < 3 || !strings.Contains(svg, "kproxy nftables") {
		t.Errorf("soak plot:\n%s", svg)
	}
}

func TestMerge(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 3, 0, 0, 0, time.UTC)
	a := &Report{Config: Config{Services: []int{10000}, Modes: []string{"nftables"}, Proxies: []Proxy{{Name: "kproxy", Bin: "/a"}, {Name: "upstream", Bin: "/u"}}, Reps: 2},
		Started: t0, Ended: t0.Add(time.Hour), API: []APIResult{{Services: 10000}}, Soak: []SoakResult{{Services: 10000}}}
	b := &Report{Config: Config{Services: []int{1000, 50000}, Modes: []string{"nftables", "iptables-nft"}, Proxies: []Proxy{{Name: "kproxy", Bin: "/b"}}},
		Started: t0.Add(-time.Hour), Ended: t0.Add(30 * time.Minute), File: []FileResult{{Services: 50000}}, Errors: []string{"x"}}
	m := Merge(a, b)
	if !slices.Equal(m.Config.Services, []int{1000, 10000, 50000}) || !slices.Equal(m.Config.Modes, []string{"nftables", "iptables-nft"}) ||
		len(m.Config.Proxies) != 2 || m.Config.Proxies[0].Bin != "/a" || m.Config.Reps != 2 {
		t.Errorf("config: %+v", m.Config)
	}
	if !m.Started.Equal(t0.Add(-time.Hour)) || !m.Ended.Equal(t0.Add(time.Hour)) {
		t.Errorf("span %s – %s", m.Started, m.Ended)
	}
	if len(m.API) != 1 || len(m.File) != 1 || len(m.Soak) != 1 || len(m.Errors) != 1 {
		t.Errorf("results: %d API, %d file, %d soak, %d errors", len(m.API), len(m.File), len(m.Soak), len(m.Errors))
	}
	if len(a.Config.Services) != 1 {
		t.Errorf("Merge changed its input: %v", a.Config.Services)
	}
}
