package harness

import (
	"strings"
	"testing"
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
