package nftables

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/nft/nfttest"
	"github.com/kproxy/kproxy/internal/proxy"
)

const ownPort = 4242

func ev(fam nft.Family, kind nft.ObjKind, deleted bool, table, name string, port uint32) nft.Event {
	return nft.Event{Family: fam, Kind: kind, Deleted: deleted, Table: table, Name: name, Count: 1, PortID: port}
}

func describe(ds []proxy.Drift) string {
	var s []string
	for _, d := range ds {
		s = append(s, string(d.Family)+": "+d.String())
	}
	return strings.Join(s, "; ")
}

// TestCoalescer: which notifications are drift, and how a storm is
// summarised.
func TestCoalescer(t *testing.T) {
	dual := []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
	for _, tc := range []struct {
		name     string
		families []v1.IPFamily
		events   []nft.Event
		drift    bool
		want     string
		repair   []v1.IPFamily
		// tables are those to re-create, per family (none: a full sync).
		tables map[v1.IPFamily][]string
	}{{
		name:   "kproxy's own changes",
		events: []nft.Event{ev(nft.IPv4, nft.KindTable, true, "kube-proxy", "", ownPort), ev(nft.IPv4, nft.KindElement, false, "kube-proxy", "service-ips", ownPort)},
	}, {
		name:   "other tables",
		events: []nft.Event{ev(nft.IPv4, nft.KindTable, true, "filter", "", 1), ev(nft.IPv4, nft.KindTable, true, "kube-proxy-sx", "", 1), ev(nft.IPv4, nft.KindTable, true, "kube-proxy-s01", "", 1)},
	}, {
		name:   "other families",
		events: []nft.Event{ev("inet", nft.KindTable, true, "kube-proxy", "", 1), ev(nft.IPv6, nft.KindTable, true, "kube-proxy", "", 1)},
	}, {
		name:   "table deleted, children folded",
		events: []nft.Event{ev(nft.IPv4, nft.KindMap, true, "kube-proxy", "service-ips", 9), ev(nft.IPv4, nft.KindElement, true, "kube-proxy", "service-ips", 9), ev(nft.IPv4, nft.KindChain, true, "kube-proxy", "services", 9), ev(nft.IPv4, nft.KindRule, true, "kube-proxy", "services", 9), ev(nft.IPv4, nft.KindTable, true, "kube-proxy", "", 9)},
		drift:  true,
		want:   "IPv4: table ip kube-proxy deleted",
		repair: []v1.IPFamily{v1.IPv4Protocol},
		tables: map[v1.IPFamily][]string{v1.IPv4Protocol: {"kube-proxy"}},
	}, {
		name:   "chain flushed",
		events: []nft.Event{ev(nft.IPv4, nft.KindRule, true, "kube-proxy", "services", 9), ev(nft.IPv4, nft.KindRule, true, "kube-proxy", "services", 9), ev(nft.IPv4, nft.KindRule, true, "kube-proxy", "services", 9)},
		drift:  true,
		want:   "IPv4: rule ip kube-proxy/services 3 deleted",
		repair: []v1.IPFamily{v1.IPv4Protocol},
		tables: map[v1.IPFamily][]string{v1.IPv4Protocol: {"kube-proxy"}},
	}, {
		name:     "map flushed in a shard, both families",
		families: dual,
		events:   []nft.Event{ev(nft.IPv6, nft.KindElement, true, "kube-proxy-s2", "service-ips", 9), ev(nft.IPv6, nft.KindElement, true, "kube-proxy-s2", "service-ips", 9), ev(nft.IPv4, nft.KindChain, true, "kube-proxy", "services", 9), ev(nft.IPv4, nft.KindRule, true, "kube-proxy", "services", 9)},
		drift:    true,
		want:     "IPv6: element ip6 kube-proxy-s2/service-ips 2 deleted; IPv4: chain ip kube-proxy/services deleted",
		repair:   dual,
		tables:   map[v1.IPFamily][]string{v1.IPv4Protocol: {"kube-proxy"}, v1.IPv6Protocol: {"kube-proxy-s2"}},
	}, {
		name:   "map deleted, its elements folded",
		events: []nft.Event{ev(nft.IPv4, nft.KindElement, true, "kube-proxy", "service-ips", 9), ev(nft.IPv4, nft.KindMap, true, "kube-proxy", "service-ips", 9)},
		drift:  true,
		want:   "IPv4: map ip kube-proxy/service-ips deleted",
		repair: []v1.IPFamily{v1.IPv4Protocol},
		tables: map[v1.IPFamily][]string{v1.IPv4Protocol: {"kube-proxy"}},
	}, {
		name:   "rule added by someone else",
		events: []nft.Event{ev(nft.IPv4, nft.KindRule, false, "kube-proxy", "filter-forward", 9)},
		drift:  true,
		want:   "IPv4: rule ip kube-proxy/filter-forward 1 added",
		repair: []v1.IPFamily{v1.IPv4Protocol},
		tables: map[v1.IPFamily][]string{v1.IPv4Protocol: {"kube-proxy"}},
	}, {
		name:     "notifications lost",
		families: dual,
		events:   []nft.Event{{Lost: true, Kind: nft.KindUnknown}},
		drift:    true,
		want:     ": unknown notifications lost (receive buffer overflowed); assuming everything changed",
		repair:   dual,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			fams := tc.families
			if fams == nil {
				fams = []v1.IPFamily{v1.IPv4Protocol}
			}
			c := newCoalescer("", fams, func(p uint32) bool { return p == ownPort })
			if got := c.add(tc.events); got != tc.drift {
				t.Fatalf("add = %v, want %v", got, tc.drift)
			}
			ds, repair, tables := c.take()
			if got := describe(ds); got != tc.want {
				t.Errorf("drift:\n got %q\nwant %q", got, tc.want)
			}
			if d := cmp.Diff(tc.repair, repair); d != "" {
				t.Errorf("families repaired (-want +got):\n%s", d)
			}
			if tc.tables == nil {
				tc.tables = map[v1.IPFamily][]string{}
			}
			if d := cmp.Diff(tc.tables, tables); d != "" {
				t.Errorf("tables to re-create (-want +got):\n%s", d)
			}
			if ds, repair, _ := c.take(); len(ds) != 0 || len(repair) != 0 {
				t.Errorf("take did not reset: %v %v", ds, repair)
			}
		})
	}
}

// TestDriftWatchCoalescesStorms: a storm spread over several datagrams
// within the window is one report and one repair per family; own changes
// are none; a watcher failure ends Run with its error.
func TestDriftWatchCoalescesStorms(t *testing.T) {
	w := nfttest.NewWatcher()
	var mu sync.Mutex
	var reports [][]proxy.Drift
	var repairs []v1.IPFamily
	dw := &DriftWatch{
		Watcher:  w,
		Own:      func(p uint32) bool { return p == ownPort },
		Families: []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol},
		Window:   50 * time.Millisecond,
		Repair:   func(f v1.IPFamily) { mu.Lock(); repairs = append(repairs, f); mu.Unlock() },
		Report:   func(ds []proxy.Drift) { mu.Lock(); reports = append(reports, ds); mu.Unlock() },
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- dw.Run(ctx) }()

	w.Send(ev(nft.IPv4, nft.KindTable, false, "kube-proxy", "", ownPort))
	for i := 0; i < 50; i++ {
		w.Send(ev(nft.IPv4, nft.KindElement, true, "kube-proxy", "service-ips", 7), ev(nft.IPv4, nft.KindRule, true, "kube-proxy", "services", 7))
	}
	w.Send(ev(nft.IPv6, nft.KindTable, true, "kube-proxy-s1", "", 7))
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(reports)
		mu.Unlock()
		if n > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(150 * time.Millisecond) // a second report would come within this
	mu.Lock()
	if len(reports) != 1 {
		t.Fatalf("%d reports, want 1: %v", len(reports), reports)
	}
	if got, want := describe(reports[0]), "IPv4: element ip kube-proxy/service-ips 50 deleted; IPv4: rule ip kube-proxy/services 50 deleted; IPv6: table ip6 kube-proxy-s1 deleted"; got != want {
		t.Errorf("report:\n got %q\nwant %q", got, want)
	}
	if d := cmp.Diff([]v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}, repairs); d != "" {
		t.Errorf("repairs (-want +got):\n%s", d)
	}
	mu.Unlock()

	// Own changes only: nothing.
	w.Send(ev(nft.IPv4, nft.KindTable, true, "kube-proxy", "", ownPort))
	time.Sleep(120 * time.Millisecond)
	mu.Lock()
	if len(reports) != 1 {
		t.Errorf("kproxy's own change was reported: %v", reports[1:])
	}
	mu.Unlock()

	boom := errors.New("socket gone")
	w.Fail(boom)
	select {
	case err := <-done:
		if !errors.Is(err, boom) {
			t.Errorf("Run = %v, want %v", err, boom)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after the watcher failed")
	}
}

// TestDriftWatchRepairsTables: with RepairTables set, the tables the
// notifications name are handed to it; lost notifications still ask
// for a full sync (Repair).
func TestDriftWatchRepairsTables(t *testing.T) {
	w := nfttest.NewWatcher()
	type call struct {
		full   bool
		family v1.IPFamily
		tables []string
	}
	calls := make(chan call, 8)
	dw := &DriftWatch{
		Watcher:      w,
		Own:          func(p uint32) bool { return p == ownPort },
		Families:     []v1.IPFamily{v1.IPv4Protocol},
		Window:       20 * time.Millisecond,
		Repair:       func(f v1.IPFamily) { calls <- call{full: true, family: f} },
		RepairTables: func(f v1.IPFamily, tables []string) { calls <- call{family: f, tables: tables} },
		Report:       func([]proxy.Drift) {},
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = dw.Run(ctx) }()
	next := func() call {
		t.Helper()
		select {
		case c := <-calls:
			return c
		case <-time.After(5 * time.Second):
			t.Fatal("no repair asked for")
			return call{}
		}
	}

	w.Send(ev(nft.IPv4, nft.KindTable, true, "kube-proxy-s3", "", 7), ev(nft.IPv4, nft.KindChain, true, "kube-proxy-s3", "services", 7),
		ev(nft.IPv4, nft.KindElement, true, "kube-proxy", "cluster-ips", 7))
	if d := cmp.Diff(call{family: v1.IPv4Protocol, tables: []string{"kube-proxy", "kube-proxy-s3"}}, next(), cmp.AllowUnexported(call{})); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	w.Send(ev(nft.IPv4, nft.KindTable, true, "kube-proxy-s1", "", 7), nft.Event{Lost: true, Kind: nft.KindUnknown})
	if d := cmp.Diff(call{full: true, family: v1.IPv4Protocol}, next(), cmp.AllowUnexported(call{})); d != "" {
		t.Errorf("lost notifications (-want +got):\n%s", d)
	}
}

// TestDriftWatchRepairsGap: when Gap says others committed before the
// watcher subscribed (or cannot tell), every family is repaired by a
// full sync once, before notifications are acted on; when it says
// nothing else committed, nothing is repaired.
func TestDriftWatchRepairsGap(t *testing.T) {
	boom := errors.New("no socket")
	for _, tc := range []struct {
		name    string
		changed bool
		err     error
		want    []v1.IPFamily
	}{
		{name: "foreign commit", changed: true, want: []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}},
		{name: "unknown", err: boom, want: []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}},
		{name: "only ours"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := nfttest.NewWatcher()
			repairs := make(chan v1.IPFamily, 8)
			asked := make(chan struct{})
			dw := &DriftWatch{
				Watcher:  w,
				Own:      func(p uint32) bool { return p == ownPort },
				Families: []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol},
				Window:   20 * time.Millisecond,
				Repair:   func(f v1.IPFamily) { repairs <- f },
				Report:   func([]proxy.Drift) {},
				Gap: func(context.Context) (bool, error) {
					close(asked)
					return tc.changed, tc.err
				},
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() { _ = dw.Run(ctx) }()
			select {
			case <-asked:
			case <-time.After(5 * time.Second):
				t.Fatal("Gap not asked")
			}
			var got []v1.IPFamily
			for range tc.want {
				select {
				case f := <-repairs:
					got = append(got, f)
				case <-time.After(5 * time.Second):
					t.Fatalf("repairs %v, want %v", got, tc.want)
				}
			}
			select {
			case f := <-repairs:
				t.Errorf("another repair: %v (after %v)", f, got)
			case <-time.After(100 * time.Millisecond):
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("repairs (-want +got):\n%s", d)
			}
		})
	}
}
