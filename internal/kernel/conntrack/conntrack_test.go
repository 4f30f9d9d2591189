package conntrack

// Addresses: 10.0.0.0/24 clients, 10.96.0.0/16 service IPs, 10.244.0.0/16
// endpoints, fd00::/8 the same roles in IPv6.

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var (
	a = netip.MustParseAddr

	toX = Flow{OrigSrc: a("10.0.0.1"), OrigSrcPort: 5000, OrigDst: a("10.96.0.10"), OrigDstPort: 53, ReplySrc: a("10.244.1.5"), ReplySrcPort: 5353}
	toY = Flow{OrigSrc: a("10.0.0.2"), OrigSrcPort: 5000, OrigDst: a("10.96.0.10"), OrigDstPort: 53, ReplySrc: a("10.244.2.5"), ReplySrcPort: 5353}
	// toXOther: the same client and endpoint, another service port.
	toXOther = Flow{OrigSrc: a("10.0.0.1"), OrigSrcPort: 5000, OrigDst: a("10.96.0.11"), OrigDstPort: 53, ReplySrc: a("10.244.1.5"), ReplySrcPort: 5353}
)

func TestFilterMatches(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    Filter
		fl   Flow
		want bool
	}{
		{"empty filter matches all", Filter{}, toX, true},
		{"service and endpoint", Filter{OrigDst: a("10.96.0.10"), OrigDstPort: 53, ReplySrc: a("10.244.1.5")}, toX, true},
		{"other endpoint", Filter{OrigDst: a("10.96.0.10"), OrigDstPort: 53, ReplySrc: a("10.244.1.5")}, toY, false},
		{"other port", Filter{OrigDst: a("10.96.0.10"), OrigDstPort: 54}, toX, false},
		{"node port, any address", Filter{OrigDstPort: 53, ReplySrc: a("10.244.1.5")}, toXOther, true},
		{"own filter", toX.Filter(), toX, true},
		{"own filter, other client port", toX.Filter(), Flow{OrigSrc: a("10.0.0.1"), OrigSrcPort: 5001, OrigDst: a("10.96.0.10"), OrigDstPort: 53, ReplySrc: a("10.244.1.5")}, false},
		{"own filter, other service", toX.Filter(), toXOther, false},
	} {
		if got := tc.f.Matches(tc.fl); got != tc.want {
			t.Errorf("%s: %v matches %v = %v, want %v", tc.name, tc.f, tc.fl, got, tc.want)
		}
	}
}

func TestFlowDNATed(t *testing.T) {
	plain := Flow{OrigSrc: a("10.0.0.1"), OrigSrcPort: 5000, OrigDst: a("10.0.0.9"), OrigDstPort: 30053, ReplySrc: a("10.0.0.9"), ReplySrcPort: 30053}
	portOnly := plain
	portOnly.ReplySrcPort = 53
	for _, tc := range []struct {
		fl   Flow
		want bool
	}{{toX, true}, {plain, false}, {portOnly, true}} {
		if got := tc.fl.DNATed(); got != tc.want {
			t.Errorf("%v DNATed = %v, want %v", tc.fl, got, tc.want)
		}
	}
}

func TestFakeDeletesMatchingFlowsOfOneFamily(t *testing.T) {
	v6 := Flow{OrigSrc: a("fd00::1"), OrigSrcPort: 5000, OrigDst: a("fd00:96::10"), OrigDstPort: 53, ReplySrc: a("fd00:244::5"), ReplySrcPort: 53}
	f := &Fake{Flows4: []Flow{toX, toY, toXOther}, Flows6: []Flow{v6}}
	n, err := f.DeleteUDP(false, []Filter{toX.Filter(), {OrigDst: a("10.96.0.99")}})
	if err != nil || n != 1 {
		t.Fatalf("DeleteUDP = %d, %v; want 1, nil", n, err)
	}
	got4, _ := f.ListUDP(false)
	got6, _ := f.ListUDP(true)
	cmpAddr := cmp.Comparer(func(x, y netip.Addr) bool { return x == y })
	if diff := cmp.Diff([]Flow{toY, toXOther}, got4, cmpAddr); diff != "" {
		t.Errorf("IPv4 flows left (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]Flow{v6}, got6, cmpAddr); diff != "" {
		t.Errorf("IPv6 flows left (-want +got):\n%s", diff)
	}
	if n, _ := f.DeleteUDP(true, nil); n != 0 || len(f.Calls) != 1 {
		t.Errorf("a call without filters deleted %d or was recorded: %+v", n, f.Calls)
	}
}
