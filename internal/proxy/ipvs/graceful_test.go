package ipvs

import (
	"net/netip"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/kernel/conntrack"
	"github.com/kproxy/kproxy/internal/kernel/ipvs/ipvstest"
)

func TestGracefulTCPRemovalWaitsForConnections(t *testing.T) {
	w := newWorld(t, Options{GracePeriod: time.Minute})
	w.plan = planOf([]netip.Addr{ep1, ep2}, nil)
	w.sync(t, true)
	vs := vsOf(protoTCP, vip, 80)
	if err := w.ipvs.SetConns(vs, ep2, 8080, 1, 2); err != nil {
		t.Fatal(err)
	}
	w.plan = planOf([]netip.Addr{ep1}, nil)
	w.sync(t, false)
	if got := destsOf(t, w.ipvs, vs); got[netip.AddrPortFrom(ep2, 8080)] != 0 || len(got) != 2 {
		t.Fatalf("removed real server with connections: %v, want it kept at weight 0", got)
	}
	// The NodePort virtual server's copy had no connections: gone at once.
	if got := destsOf(t, w.ipvs, vsOf(protoTCP, node, 30080)); len(got) != 1 {
		t.Errorf("real server without connections kept: %v", got)
	}
	// Still connections: it stays, across syncs.
	w.now = w.now.Add(30 * time.Second)
	w.sync(t, false)
	if got := destsOf(t, w.ipvs, vs); len(got) != 2 {
		t.Fatalf("terminating real server deleted while it has connections: %v", got)
	}
	// The connections end: the next sync deletes it.
	if err := w.ipvs.SetConns(vs, ep2, 8080, 0, 0); err != nil {
		t.Fatal(err)
	}
	w.sync(t, false)
	if got := destsOf(t, w.ipvs, vs); len(got) != 1 {
		t.Fatalf("real server without connections left kept: %v", got)
	}
	// Nothing left to do afterwards.
	w.resetCalls()
	w.sync(t, false)
	if n := w.writes(); n != 0 {
		t.Errorf("%d writes after the termination ended", n)
	}
}

func TestGracefulBoundAndComeback(t *testing.T) {
	w := newWorld(t, Options{GracePeriod: time.Minute})
	w.plan = planOf([]netip.Addr{ep1, ep2}, nil)
	w.sync(t, true)
	vs := vsOf(protoTCP, vip, 80)
	if err := w.ipvs.SetConns(vs, ep2, 8080, 5, 0); err != nil {
		t.Fatal(err)
	}
	w.plan = planOf([]netip.Addr{ep1}, nil)
	w.sync(t, false)
	// The endpoint comes back while terminating: weight 1 again, kept.
	w.plan = planOf([]netip.Addr{ep1, ep2}, nil)
	w.now = w.now.Add(2 * time.Minute)
	w.sync(t, false)
	if got := destsOf(t, w.ipvs, vs); got[netip.AddrPortFrom(ep2, 8080)] != 1 {
		t.Fatalf("endpoint back during its termination: %v, want weight 1", got)
	}
	// Removed again; its connections never end: deleted after the bound.
	w.plan = planOf([]netip.Addr{ep1}, nil)
	w.sync(t, false)
	w.now = w.now.Add(59 * time.Second)
	w.sync(t, false)
	if got := destsOf(t, w.ipvs, vs); len(got) != 2 {
		t.Fatalf("deleted before its grace period ended: %v", got)
	}
	w.now = w.now.Add(2 * time.Second)
	w.sync(t, false)
	if got := destsOf(t, w.ipvs, vs); len(got) != 1 {
		t.Fatalf("kept after its grace period: %v", got)
	}
}

func TestGracefulRestartResumes(t *testing.T) {
	// kproxy restarts while a real server terminates: the new proxier
	// finds it at weight 0 and goes on waiting, then deletes it.
	w := newWorld(t, Options{})
	w.plan = planOf([]netip.Addr{ep1, ep2}, nil)
	w.sync(t, true)
	vs := vsOf(protoTCP, vip, 80)
	if err := w.ipvs.SetConns(vs, ep2, 8080, 1, 0); err != nil {
		t.Fatal(err)
	}
	w.plan = planOf([]netip.Addr{ep1}, nil)
	w.sync(t, false)
	w.restart(Options{})
	w.sync(t, true)
	if got := destsOf(t, w.ipvs, vs); len(got) != 2 || got[netip.AddrPortFrom(ep2, 8080)] != 0 {
		t.Fatalf("after a restart: %v, want the terminating server at weight 0", got)
	}
	if err := w.ipvs.SetConns(vs, ep2, 8080, 0, 0); err != nil {
		t.Fatal(err)
	}
	w.sync(t, false)
	if got := destsOf(t, w.ipvs, vs); len(got) != 1 {
		t.Fatalf("after a restart and the connections' end: %v", got)
	}
}

func TestGracefulUDPGoesAtOnceWithConntrack(t *testing.T) {
	w := newWorld(t, Options{})
	w.plan = planOf(nil, []netip.Addr{ep1, ep2})
	w.sync(t, true)
	vs := vsOf(protoUDP, vip, 53)
	if err := w.ipvs.SetConns(vs, ep2, 5353, 0, 4); err != nil {
		t.Fatal(err)
	}
	flow := conntrack.Flow{OrigSrc: node, OrigSrcPort: 40000, OrigDst: vip, OrigDstPort: 53, ReplySrc: ep2, ReplySrcPort: 5353}
	keep := conntrack.Flow{OrigSrc: node, OrigSrcPort: 40001, OrigDst: vip, OrigDstPort: 53, ReplySrc: ep1, ReplySrcPort: 5353}
	w.ct.Flows4 = []conntrack.Flow{flow, keep}
	w.plan = planOf(nil, []netip.Addr{ep1})
	w.sync(t, false)
	if got := destsOf(t, w.ipvs, vs); len(got) != 1 {
		t.Fatalf("UDP real server kept for its connections: %v", got)
	}
	if len(w.ct.Flows4) != 1 || w.ct.Flows4[0] != keep {
		t.Errorf("conntrack after the UDP removal: %v, want only the flow to %s", w.ct.Flows4, ep1)
	}
	if n := w.ipvs.Calls(ipvstest.OpUpdateDestination); n != 0 {
		t.Errorf("UDP real server set to weight 0 (%d updates) instead of deleted", n)
	}
}
