package nfnetlink

// Kernel test of the notification listener, in a fresh network namespace
// (kernel_test.go's helpers); no traffic, only nf_tables objects.

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

// TestKernelMonitorTellsOwnChangesFromOthers: a transaction sent through
// Netlink is notified with Netlink's own port id; the same kind of change
// made by the nft binary carries another one. Deleting a table, flushing
// a chain and deleting an element are each notified with the names.
func TestKernelMonitorTellsOwnChangesFromOthers(t *testing.T) {
	ns := newKernelNS(t)
	mon, err := NewMonitor(WithNetNSPath("/run/netns/" + ns.name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mon.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var mu sync.Mutex
	var got []nft.Event
	done := make(chan error, 1)
	go func() {
		done <- mon.Watch(ctx, func(evs []nft.Event) { mu.Lock(); got = append(got, evs...); mu.Unlock() })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch: %v", err)
		}
	})
	// wait collects events until cond holds (bounded).
	wait := func(what string, cond func(evs []nft.Event) bool) []nft.Event {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			mu.Lock()
			evs := append([]nft.Event(nil), got...)
			mu.Unlock()
			if cond(evs) {
				mu.Lock()
				got = nil
				mu.Unlock()
				return evs
			}
			time.Sleep(10 * time.Millisecond)
		}
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("%s: not notified within 5 s; events: %+v", what, got)
		return nil
	}
	has := func(evs []nft.Event, k nft.ObjKind, deleted bool, table, name string) (nft.Event, bool) {
		for _, e := range evs {
			if e.Kind == k && e.Deleted == deleted && e.Table == table && e.Name == name {
				return e, true
			}
		}
		return nft.Event{}, false
	}

	tx := nft.NewTransaction(nft.IPv4, "drift")
	tx.Add(&nft.Table{}, &nft.Chain{Name: "c"}, &nft.Set{Name: "m", Key: []nft.DataType{nft.TypeIPv4Addr}, Data: nft.TypeVerdict})
	tx.Add(&nft.Rule{Chain: "c", Stmts: []nft.Stmt{nft.Counter{}}}, &nft.Rule{Chain: "c", Stmts: []nft.Stmt{nft.Counter{}}})
	tx.Add(&nft.Element{Set: "m", Key: []nft.Value{{Addr: netip.MustParseAddr("198.19.0.1")}}, Verdict: &nft.Verdict{Kind: nft.Drop}})
	if err := ns.nl.Apply(ctx, tx); err != nil {
		t.Fatal(err)
	}
	evs := wait("kproxy's transaction", func(evs []nft.Event) bool {
		_, ok := has(evs, nft.KindElement, false, "drift", "m")
		return ok
	})
	for _, e := range evs {
		if !ns.nl.OwnPort(e.PortID) {
			t.Errorf("%+v: port id %d is not Netlink's own", e, e.PortID)
		}
	}
	if e, ok := has(evs, nft.KindMap, false, "drift", "m"); !ok || e.Family != nft.IPv4 {
		t.Errorf("no map notification for m: %+v", evs)
	}

	steps := []struct {
		cmd     string
		kind    nft.ObjKind
		deleted bool
		name    string
	}{
		{"delete element ip drift m { 198.19.0.1 }", nft.KindElement, true, "m"},
		{"flush chain ip drift c", nft.KindRule, true, "c"},
		{"delete table ip drift", nft.KindTable, true, ""},
	}
	for _, s := range steps {
		ns.nft(t, strings.Fields(s.cmd)...)
		evs := wait(s.cmd, func(evs []nft.Event) bool { _, ok := has(evs, s.kind, s.deleted, "drift", s.name); return ok })
		for _, e := range evs {
			if ns.nl.OwnPort(e.PortID) {
				t.Errorf("%s: %+v has kproxy's port id", s.cmd, e)
			}
		}
		t.Logf("%s: %d events, first %+v", s.cmd, len(evs), evs[0])
	}
}
