package proxy

import (
	"context"
	"errors"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/model"
)

// scriptedBackend fails its first fails syncs, then succeeds.
type scriptedBackend struct {
	fails, calls int
}

func (b *scriptedBackend) Sync(context.Context, *Request) (*Result, error) {
	b.calls++
	if b.calls <= b.fails {
		return nil, errors.New("kernel said no")
	}
	return &Result{}, nil
}

// TestAfterFirstSync: the old mode's rules are removed only once every
// family has synced successfully, exactly once when that works, and a
// failing removal is retried after later syncs, a bounded number of times.
func TestAfterFirstSync(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		// v4Fails, v6Fails: failed syncs before each family's first success.
		v4Fails, v6Fails int
		// removeFails: failed removals before one works (-1: never works).
		removeFails int
		syncs       int
		// wantRemoveAt: the loop sync (1-based) after which each removal
		// attempt ran.
		wantRemoveAt []int
		wantDone     bool
	}{
		{name: "both families sync at once", syncs: 4, wantRemoveAt: []int{1}, wantDone: true},
		{name: "IPv6 fails twice first", v6Fails: 2, syncs: 5, wantRemoveAt: []int{3}, wantDone: true},
		{name: "IPv4 never syncs", v4Fails: 100, syncs: 10, wantRemoveAt: nil, wantDone: false},
		{name: "removal fails once", removeFails: 1, syncs: 5, wantRemoveAt: []int{1, 2}, wantDone: true},
		{name: "removal never works", removeFails: -1, syncs: 9, wantRemoveAt: []int{1, 2, 3, 4, 5}, wantDone: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v4, v6 := &scriptedBackend{fails: tc.v4Fails}, &scriptedBackend{fails: tc.v6Fails}
			backends := map[v1.IPFamily]Backend{model.IPv4: v4, model.IPv6: v6}
			sync := 0
			var removedAt []int
			a := NewAfterFirstSync("test rules", backends, func(context.Context) error {
				removedAt = append(removedAt, sync)
				if tc.removeFails < 0 || len(removedAt) <= tc.removeFails {
					return errors.New("xtables lock held")
				}
				return nil
			})
			for sync = 1; sync <= tc.syncs; sync++ {
				for _, b := range backends {
					_, _ = b.Sync(ctx, &Request{})
				}
				if v4.calls != sync || v6.calls != sync {
					t.Fatalf("sync %d: the wrapped backends were called %d and %d times", sync, v4.calls, v6.calls)
				}
				a.Run(ctx)
				synced := false
				select {
				case <-a.Synced():
					synced = true
				default:
				}
				if want := len(tc.wantRemoveAt) > 0 && sync >= tc.wantRemoveAt[0]; synced != want {
					t.Errorf("sync %d: Synced closed = %v, want %v", sync, synced, want)
				}
			}
			if !slices.Equal(removedAt, tc.wantRemoveAt) {
				t.Errorf("removal ran after syncs %v, want %v", removedAt, tc.wantRemoveAt)
			}
			if a.Done() != tc.wantDone {
				t.Errorf("done() = %v, want %v", a.Done(), tc.wantDone)
			}
		})
	}
}

// TestAfterFirstSyncCanceled: a stopping kproxy removes nothing.
func TestAfterFirstSyncCanceled(t *testing.T) {
	backends := map[v1.IPFamily]Backend{model.IPv4: &scriptedBackend{}}
	called := false
	a := NewAfterFirstSync("test rules", backends, func(context.Context) error { called = true; return nil })
	ctx, cancel := context.WithCancel(context.Background())
	_, _ = backends[model.IPv4].Sync(ctx, &Request{})
	cancel()
	a.Run(ctx)
	if called || a.Done() {
		t.Errorf("removal ran (%v) or done (%v) after the context ended", called, a.Done())
	}
	var none *AfterFirstSync
	none.Run(ctx) // no mode with old rules to remove: a no-op
	if !none.Done() {
		t.Error("a nil afterFirstSync is not done")
	}
}

// driftingBackend is a backend with iptables mode's drift check.
type driftingBackend struct{ scriptedBackend }

func (b *driftingBackend) CheckDrift(context.Context) ([]Drift, error) {
	return []Drift{{Kind: "chain"}}, nil
}

// tableRepairingBackend is a backend with nftables mode's targeted repair.
type tableRepairingBackend struct {
	scriptedBackend
	tables []string
}

func (b *tableRepairingBackend) RepairTables(t []string) { b.tables = append(b.tables, t...) }
func (b *tableRepairingBackend) WantsRepair() bool       { return len(b.tables) > 0 }

// TestAfterFirstSyncWrappers: the wrapper keeps the backend's drift check
// reachable (hiding it switched iptables mode's drift repair off), and a
// successful trial of failure isolation, which may only have been
// checked, does not count as a first sync.
func TestAfterFirstSyncWrappers(t *testing.T) {
	ctx := context.Background()
	backends := map[v1.IPFamily]Backend{model.IPv4: &driftingBackend{}}
	removed := 0
	a := NewAfterFirstSync("test rules", backends, func(context.Context) error { removed++; return nil })
	c, ok := backends[model.IPv4].(DriftChecker)
	if !ok {
		t.Fatalf("the wrapped backend %T hides CheckDrift", backends[model.IPv4])
	}
	if ds, _ := c.CheckDrift(ctx); len(ds) != 1 {
		t.Errorf("CheckDrift through the wrapper gave %v, want the backend's one drift", ds)
	}
	// nftables mode's targeted drift repair passes too.
	nb := map[v1.IPFamily]Backend{model.IPv4: &tableRepairingBackend{}}
	NewAfterFirstSync("test rules", nb, func(context.Context) error { return nil })
	tr, ok := nb[model.IPv4].(TableRepairer)
	if !ok {
		t.Fatalf("the wrapped backend %T hides RepairTables", nb[model.IPv4])
	}
	if tr.RepairTables([]string{"kube-proxy-s3"}); !tr.WantsRepair() {
		t.Errorf("RepairTables through the wrapper did not reach the backend")
	}

	if _, err := backends[model.IPv4].Sync(ctx, &Request{Trial: true}); err != nil {
		t.Fatal(err)
	}
	a.Run(ctx)
	if removed != 0 {
		t.Errorf("the old rules were removed after a trial alone")
	}
	if _, err := backends[model.IPv4].Sync(ctx, &Request{}); err != nil {
		t.Fatal(err)
	}
	a.Run(ctx)
	if removed != 1 {
		t.Errorf("the old rules were removed %d times after the first real sync, want 1", removed)
	}
}
