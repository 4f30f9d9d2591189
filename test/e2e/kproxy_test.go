package e2e

// Helpers that read kproxy's rules and metrics, and their unit tests (which
// need neither root nor a control plane).

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// nftMap is one map of `nft -j list maps` output, with its element keys as
// strings, sorted.
type nftMap struct {
	Family, Table, Name string
	Keys                []string
}

// parseMaps reads `nft -j list maps` (or `list map`) output. A
// concatenated key is {"concat": [addr, proto, port]}; an element with a
// comment (kproxy comments every element) wraps it as
// {"elem": {"val": key, "comment": ...}}.
func parseMaps(jsonText string) ([]nftMap, error) {
	var doc struct {
		Nftables []struct {
			Map *struct {
				Family string              `json:"family"`
				Table  string              `json:"table"`
				Name   string              `json:"name"`
				Elem   [][]json.RawMessage `json:"elem"`
			} `json:"map"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(jsonText), &doc); err != nil {
		return nil, fmt.Errorf("parsing nft -j output: %w", err)
	}
	type concat struct {
		Concat []any `json:"concat"`
	}
	var maps []nftMap
	for _, o := range doc.Nftables {
		if o.Map == nil {
			continue
		}
		m := nftMap{Family: o.Map.Family, Table: o.Map.Table, Name: o.Map.Name}
		if strings.HasPrefix(m.Name, "endpoints-") || strings.HasPrefix(m.Name, "cluster-endpoints-") {
			// Endpoint maps (numgen index, or service address . port
			// . numgen index -> endpoint) are no service addresses.
			maps = append(maps, m)
			continue
		}
		for _, e := range o.Map.Elem {
			if len(e) != 2 {
				return nil, fmt.Errorf("map element %s is not [key, value]", e)
			}
			var k struct {
				concat
				Elem *struct {
					Val concat `json:"val"`
				} `json:"elem"`
			}
			if err := json.Unmarshal(e[0], &k); err != nil {
				return nil, fmt.Errorf("map key %s: %w", e[0], err)
			}
			parts := k.Concat
			if k.Elem != nil {
				parts = k.Elem.Val.Concat
			}
			if len(parts) == 0 {
				return nil, fmt.Errorf("map key %s: not a concatenation", e[0])
			}
			s := make([]string, len(parts))
			for i, p := range parts {
				s[i] = fmt.Sprint(p)
			}
			m.Keys = append(m.Keys, strings.Join(s, " . "))
		}
		slices.Sort(m.Keys)
		maps = append(maps, m)
	}
	return maps, nil
}

// metricCount returns the _count sample of histogram name summed over its
// label sets, and whether the metric is present at all.
func metricCount(metrics, name string) (float64, bool) {
	var sum float64
	found := false
	for _, line := range strings.Split(metrics, "\n") {
		rest, ok := strings.CutPrefix(line, name+"_count")
		if !ok || (rest != "" && rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		f := strings.Fields(rest[strings.LastIndex(rest, "}")+1:])
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		sum += v
		found = true
	}
	return sum, found
}

func TestParseMaps(t *testing.T) {
	tests := []struct {
		name    string
		json    string
		want    []nftMap
		wantErr bool
	}{
		{
			name: "plain and commented elements, maps of two tables",
			json: `{"nftables": [{"metainfo": {"version": "1.0.6"}}, {"map": {"family": "ip", "table": "kube-proxy-s0", "name": "service-ips", "elem": [
				[{"elem": {"val": {"concat": ["198.19.0.1", "tcp", 443]}, "comment": "default/kubernetes:https/TCP"}}, {"goto": {"target": "a"}}],
				[{"concat": ["198.19.0.10", "udp", 53]}, {"goto": {"target": "b"}}]]}},
				{"map": {"family": "ip6", "table": "kube-proxy-s1", "name": "service-nodeports", "elem": [
				[{"concat": ["tcp", 30080]}, {"goto": {"target": "c"}}]]}}]}`,
			want: []nftMap{
				{Family: "ip", Table: "kube-proxy-s0", Name: "service-ips", Keys: []string{"198.19.0.1 . tcp . 443", "198.19.0.10 . udp . 53"}},
				{Family: "ip6", Table: "kube-proxy-s1", Name: "service-nodeports", Keys: []string{"tcp . 30080"}},
			},
		},
		{
			name: "empty map",
			json: `{"nftables": [{"map": {"family": "ip", "table": "kube-proxy", "name": "service-ips"}}]}`,
			want: []nftMap{{Family: "ip", Table: "kube-proxy", Name: "service-ips"}},
		},
		{
			name:    "a key of unknown shape is an error, not an empty key",
			json:    `{"nftables": [{"map": {"elem": [[{"prefix": {"addr": "10.0.0.0", "len": 8}}, {"accept": null}]]}}]}`,
			wantErr: true,
		},
		{
			name: "endpoint maps keyed by service are skipped",
			json: `{"nftables": [{"map": {"family": "ip", "table": "kube-proxy-s0", "name": "cluster-endpoints-tcp", "elem": [
				[{"concat": ["198.19.0.10", 80, 0]}, {"concat": ["198.18.129.10", 8080]}]]}}]}`,
			want: []nftMap{{Family: "ip", Table: "kube-proxy-s0", Name: "cluster-endpoints-tcp"}},
		},
		{name: "not JSON", json: `table ip kube-proxy {`, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseMaps(tc.json)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("maps (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMetricCount(t *testing.T) {
	metrics := `# HELP kubeproxy_sync_proxy_rules_duration_seconds x
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="+Inf"} 3
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"} 3
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv6"} 2
kubeproxy_sync_proxy_rules_duration_seconds_counted 99
plain_count 7
`
	tests := []struct {
		name      string
		want      float64
		wantFound bool
	}{
		{name: "kubeproxy_sync_proxy_rules_duration_seconds", want: 5, wantFound: true},
		{name: "plain", want: 7, wantFound: true},
		{name: "kubeproxy_network_programming_duration_seconds"},
	}
	for _, tc := range tests {
		got, found := metricCount(metrics, tc.name)
		if got != tc.want || found != tc.wantFound {
			t.Errorf("metricCount(%s) = %v, %v; want %v, %v", tc.name, got, found, tc.want, tc.wantFound)
		}
	}
}

func TestMetricValue(t *testing.T) {
	metrics := `# HELP kubeproxy_sync_proxy_rules_last_timestamp_seconds x
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7646726e+09
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} 0
kubeproxy_network_programming_duration_seconds_sum{ip_family="IPv4"} 0.125
kubeproxy_network_programming_duration_seconds_sum_other{ip_family="IPv4"} 9
plain 7
`
	tests := []struct {
		series    string
		want      float64
		wantFound bool
	}{
		{`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}`, 1.7646726e+09, true},
		{`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"}`, 0, true},
		{`kubeproxy_network_programming_duration_seconds_sum{ip_family="IPv4"}`, 0.125, true},
		{"plain", 7, true},
		// A prefix of a series is not the series.
		{`kubeproxy_sync_proxy_rules_last_timestamp_seconds`, 0, false},
		{`kubeproxy_network_programming_duration_seconds_sum{ip_family="IPv6"}`, 0, false},
	}
	for _, tc := range tests {
		got, found := metricValue(metrics, tc.series)
		if got != tc.want || found != tc.wantFound {
			t.Errorf("metricValue(%s) = %v, %v; want %v, %v", tc.series, got, found, tc.want, tc.wantFound)
		}
	}
}

func TestPercentile(t *testing.T) {
	ms := func(ns ...int) []time.Duration {
		var out []time.Duration
		for _, n := range ns {
			out = append(out, time.Duration(n)*time.Millisecond)
		}
		return out
	}
	twenty := ms(20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1)
	tests := []struct {
		name string
		xs   []time.Duration
		q    float64
		want time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"one", ms(7), 0.99, 7 * time.Millisecond},
		{"median of 20 is the 10th", twenty, 0.5, 10 * time.Millisecond},
		{"p99 of 20 is the largest", twenty, 0.99, 20 * time.Millisecond},
		{"p95 of 20 is the 19th", twenty, 0.95, 19 * time.Millisecond},
		{"median of 3, unsorted", ms(30, 10, 20), 0.5, 20 * time.Millisecond},
	}
	for _, tc := range tests {
		if got := percentile(tc.xs, tc.q); got != tc.want {
			t.Errorf("%s: percentile(%v) = %v, want %v", tc.name, tc.q, got, tc.want)
		}
	}
}
