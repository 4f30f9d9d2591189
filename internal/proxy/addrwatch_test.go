package proxy

// Address plan: 198.18.0.0/16 nodes and pods.

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kproxy/kproxy/internal/model"
)

// inPods picks the addresses in 198.18.129.0/24, as nodePortAddresses
// 198.18.129.0/24 would.
func inPods(_ *model.Node, addrs []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		if netip.MustParsePrefix("198.18.129.0/24").Contains(a) {
			out = append(out, a)
		}
	}
	return out
}

func TestAddressWatch(t *testing.T) {
	host := []netip.Addr{netip.MustParseAddr("198.18.0.10"), netip.MustParseAddr("198.18.129.1")}
	var readErr error
	w := NewAddressWatch(func() ([]netip.Addr, error) { return host, readErr }, inPods)
	if w.Changed() {
		t.Fatal("changed before any full sync")
	}
	w.Rendered(nil, inPods(nil, host), false)
	if w.Changed() {
		t.Fatal("changed with the same addresses")
	}
	// An address outside the CIDRs comes: nothing the rules use.
	host = append(host, netip.MustParseAddr("198.18.0.11"))
	if w.Changed() {
		t.Fatal("an address the CIDRs do not select made a change")
	}
	host = append(host, netip.MustParseAddr("198.18.129.77"))
	if !w.Changed() {
		t.Fatal("an address the CIDRs select was added: no change")
	}
	readErr = errors.New("netlink down")
	if w.Changed() {
		t.Error("a failed read is a change (the next full sync reports it)")
	}
	readErr = nil
	// Rules matching every local address have nothing to watch.
	w.Rendered(nil, nil, true)
	if w.Changed() {
		t.Error("changed while the rules match every local address")
	}
	var none *AddressWatch
	if NewAddressWatch(nil, inPods) != nil || none.Changed() {
		t.Error("a watch without a host to ask is not nil, or nil reports a change")
	}
	none.Rendered(nil, nil, false) // no panic
}

// wantingBackend is a recordingBackend that says its next sync must be full.
type wantingBackend struct {
	recordingBackend
	want bool
}

func (b *wantingBackend) WantsFullSync() bool { return b.want }

// TestLoopFullSyncWanted: a backend that wants a full sync gets one at the
// next sync, also the periodic one with nothing else to do.
func TestLoopFullSyncWanted(t *testing.T) {
	ctx := context.Background()
	tr := model.NewTracker(model.TrackerOptions{Hostname: "node-a", Families: []v1.IPFamily{model.IPv4}})
	b := &wantingBackend{}
	clk := clocktesting.NewFakeClock(time.Now())
	l := New(Options{Tracker: tr, Backends: map[v1.IPFamily]Backend{model.IPv4: b}, SyncPeriod: 30 * time.Second,
		FullSyncPeriod: DefaultFullSyncPeriod, Clock: clk})
	tr.ServiceUpdated(makeService("a", "198.19.0.1"))
	tr.Synced()
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	clk.Step(31 * time.Second)
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if len(b.reqs) != 1 {
		t.Fatalf("%d backend calls with nothing to do, want 1", len(b.reqs))
	}
	b.want = true
	clk.Step(31 * time.Second)
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if len(b.reqs) != 2 || !b.last(t).Full {
		t.Fatalf("%d backend calls, last full=%v; want a full sync asked for by the backend", len(b.reqs), len(b.reqs) == 2 && b.reqs[1].Full)
	}
}
