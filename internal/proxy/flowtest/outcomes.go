package flowtest

// Checks that look at each outcome of a trace rather than at the table's
// summary of it.

import (
	"net/netip"
	"testing"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/testutil/fixtures"
	"github.com/kproxy/kproxy/internal/trace"
)

func traceOrFail(t *testing.T, tr Tracer, p trace.Packet) *trace.Result {
	t.Helper()
	res, err := tr.Trace(p, HostA)
	if err != nil {
		t.Fatalf("trace %s: %v", p, err)
	}
	return res
}

// checkHairpin: a pod reaching its own service is masqueraded exactly
// when it is sent to itself.
func checkHairpin(t *testing.T, load Adapter) {
	tr := load(t, Example(t, example.NodeA))
	for _, tc := range []struct {
		name string
		src  string
		dst  string
	}{
		{"web-clusterip", "198.18.129.10", "198.19.0.10:80"},
		{"web-nodeport clusterIP", "198.18.129.10", "198.19.0.11:80"},
		{"dual-stack IPv6", "fd00:18:1:a::50", "[fd00:19::17]:80"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := traceOrFail(t, tr, Case{Src: tc.src, IIF: PodIIF, Dst: tc.dst}.Packet())
			if len(res.Outcomes) != 2 {
				t.Fatalf("want one outcome per endpoint, got:\n%s", res)
			}
			self := 0
			for _, o := range res.Outcomes {
				if o.Verdict != trace.VerdictAccept || o.DNAT == nil {
					t.Fatalf("want DNAT, got %s", o.Summary())
				}
				toSelf := o.DNAT.Addr() == netip.MustParseAddr(tc.src)
				if toSelf {
					self++
				}
				if o.Masquerade != toSelf {
					t.Errorf("dnat to %s: masquerade=%v, want %v\n%s", o.DNAT, o.Masquerade, toSelf, res)
				}
			}
			if self != 1 {
				t.Errorf("%d outcomes go back to the source, want 1:\n%s", self, res)
			}
		})
	}
}

// checkAffinity: once a client's connection was sent to an endpoint, its
// next connections go there too; other clients still get every endpoint.
func checkAffinity(t *testing.T, load Adapter) {
	first := Case{Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.16:80"}
	for i := range 2 {
		// Each endpoint in turn is the one remembered, on fresh rules.
		tr := load(t, Example(t, example.NodeA))
		res := traceOrFail(t, tr, first.Packet())
		if len(res.Outcomes) != 2 {
			t.Fatalf("first connection: want 2 outcomes, got:\n%s", res)
		}
		chosen := res.Outcomes[i]
		if chosen.DNAT == nil || len(chosen.AffinityUpdates) != 1 {
			t.Fatalf("the DNAT should record the client for affinity once: %s %v", chosen.Summary(), chosen.AffinityUpdates)
		}
		if err := tr.Remember(chosen); err != nil {
			t.Fatal(err)
		}
		// More connections from the same client (other source ports)
		// all stick.
		for port := uint16(40000); port <= 40002; port++ {
			p := first.Packet()
			p.SrcPort = port
			res := traceOrFail(t, tr, p)
			if len(res.Outcomes) != 1 || res.Outcomes[0].DNAT == nil || *res.Outcomes[0].DNAT != *chosen.DNAT {
				t.Errorf("next connection: want only %s, got:\n%s", chosen.DNAT, res)
			}
		}
		for _, other := range []Case{
			{Src: "198.18.129.6", IIF: PodIIF, Dst: first.Dst},
			{Src: RemotePod, IIF: LanIIF, Dst: first.Dst},
		} {
			if out, _, _ := Summary(traceOrFail(t, tr, other.Packet())); out != AffinityEps {
				t.Errorf("another client %s: got %q, want %q", other.Src, out, AffinityEps)
			}
		}
	}
}

// checkEqualShares: seven endpoints each get an equal share, as the
// kernel evaluates the rules (iptables' statistic match is a 31-bit
// fraction).
func checkEqualShares(t *testing.T, load Adapter) {
	s := Example(t, example.NodeA)
	n := fixtures.SPName("web-clusterip", "http", model.TCP)
	var eps []*model.Endpoint
	for i := range 7 {
		ip := netip.AddrFrom4([4]byte{198, 18, 130, byte(100 + i)})
		eps = append(eps, &model.Endpoint{IP: ip, Port: 8080, Ready: true, Serving: true, NodeName: example.NodeB, Zone: "zone-b"})
	}
	s.States[model.IPv4].Endpoints[n] = eps
	res := traceOrFail(t, load(t, s), Case{Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.10:80"}.Packet())
	if len(res.Outcomes) != 7 || len(res.Endpoints()) != 7 {
		t.Fatalf("want 7 outcomes to 7 endpoints, got\n%s", res)
	}
	for _, o := range res.Outcomes {
		if d := o.Probability - 1.0/7; d > 1e-6 || d < -1e-6 {
			t.Errorf("%v gets %.9f, want 1/7", o.DNAT, o.Probability)
		}
	}
}
