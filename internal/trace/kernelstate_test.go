package trace

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kproxy/kproxy/internal/kernel/ipvs"
)

// Addresses: 198.19.0.0/16 services, 198.18.0.0/16 pods.
func TestIPVSServiceOf(t *testing.T) {
	for _, tc := range []struct {
		name  string
		svc   ipvs.Service
		reals []ipvs.Destination
		want  IPVSService
	}{{
		name: "mh with sh-port, persistent, mapped addresses",
		svc: ipvs.Service{VirtualServer: ipvs.VirtualServer{Protocol: 6, Addr: netip.MustParseAddr("::ffff:198.19.0.10"), Port: 80},
			Scheduler: "mh", Flags: ipvs.FlagPersistent | ipvsFlagSHPort, Timeout: 600},
		reals: []ipvs.Destination{{Addr: netip.MustParseAddr("::ffff:198.18.1.1"), Port: 8080, Weight: 1}, {Addr: netip.MustParseAddr("198.18.1.2"), Port: 8080}},
		want: IPVSService{Proto: "TCP", Addr: netip.MustParseAddrPort("198.19.0.10:80"), Scheduler: "mh", Persistent: true, Timeout: 600, Flags: []string{"sh-port"},
			Reals: []IPVSReal{{Addr: netip.MustParseAddrPort("198.18.1.1:8080"), Weight: 1, Method: "masq"}, {Addr: netip.MustParseAddrPort("198.18.1.2:8080"), Method: "masq"}}},
	}, {
		name: "a foreign protocol keeps its number",
		svc:  ipvs.Service{VirtualServer: ipvs.VirtualServer{Protocol: 33, Addr: netip.MustParseAddr("198.19.0.11"), Port: 5}, Scheduler: "rr"},
		want: IPVSService{Proto: "33", Addr: netip.MustParseAddrPort("198.19.0.11:5"), Scheduler: "rr"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, IPVSServiceOf(tc.svc, tc.reals), cmpopts.EquateComparable(netip.AddrPort{})); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
