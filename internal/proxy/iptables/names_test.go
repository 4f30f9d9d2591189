package iptables

import (
	"math"
	"strconv"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/testutil/fixtures"
)

// TestChainNames checks the hashed names against upstream's (from its
// proxier tests): operators' scripts and upstream's cleanup find chains by
// these names.
func TestChainNames(t *testing.T) {
	n := model.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns1", Name: "svc1"}, Port: "p80", Protocol: model.TCP}
	c := newServiceChains(n)
	for _, tc := range []struct{ got, want string }{
		{c.svc, "KUBE-SVC-XPGD46QRK7WJZT7O"},
		{c.svl, "KUBE-SVL-XPGD46QRK7WJZT7O"},
		{c.ext, "KUBE-EXT-XPGD46QRK7WJZT7O"},
		{c.fw, "KUBE-FW-XPGD46QRK7WJZT7O"},
		{c.endpointChain(fixtures.Endpoint("10.180.0.1", 80, false, nil)), "KUBE-SEP-SXIVWICOYRO3J4NJ"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %s, want %s", tc.got, tc.want)
		}
	}
	unnamed := model.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns1", Name: "svc1"}, Protocol: model.UDP}
	if got := portName(unnamed); got != "ns1/svc1" {
		t.Errorf("unnamed port: %q, want ns1/svc1", got)
	}
	for _, tc := range []struct {
		name string
		ours bool
	}{
		{"KUBE-SVC-XPGD46QRK7WJZT7O", true},
		{"KUBE-SEP-SXIVWICOYRO3J4NJ", true},
		{"KUBE-XLB-XPGD46QRK7WJZT7O", true},
		{"KUBE-SERVICES", false},
		{"KUBE-SVC-SHORT", false},
		{"KUBE-POD-FW-XPGD46QRK7WJZT7O", false},
	} {
		if got := isServiceChain(tc.name); got != tc.ours {
			t.Errorf("isServiceChain(%s) = %v, want %v", tc.name, got, tc.ours)
		}
	}
}

// TestProbabilities checks the statistic rules' maths: rule i of n is
// tried only when rules 0..i-1 did not match and matches with 1/(n-i), so
// endpoint i gets prod_{j<i}(1-p_j) * p_i, which must be 1/n for every i
// (the last rule has no statistic match: p = 1). The printed values are
// rounded to ten decimals, as upstream writes them; the shares stay within
// 1e-9 of equal.
func TestProbabilities(t *testing.T) {
	for _, n := range []int{1, 2, 3, 7, 10, 100, 1000} {
		remaining := 1.0
		for i := 0; i < n; i++ {
			p := 1.0
			if i < n-1 {
				s := probability(n - i)
				var err error
				if p, err = strconv.ParseFloat(s, 64); err != nil {
					t.Fatalf("probability(%d) = %q: %v", n-i, s, err)
				}
			}
			share := remaining * p
			if math.Abs(share-1/float64(n)) > 1e-9*float64(n) {
				t.Errorf("n=%d: endpoint %d gets %.12f, want %.12f", n, i, share, 1/float64(n))
			}
			remaining -= share
		}
		if math.Abs(remaining) > 1e-9 {
			t.Errorf("n=%d: %.12f of the traffic reaches no endpoint", n, remaining)
		}
	}
	// Upstream's exact strings ("%0.10f").
	for remaining, want := range map[int]string{2: "0.5000000000", 3: "0.3333333333", 10: "0.1000000000", 7: "0.1428571429"} {
		if got := probability(remaining); got != want {
			t.Errorf("probability(%d) = %s, want %s", remaining, got, want)
		}
	}
}
