package idlemem

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

const quiet = 2 * time.Second

// start runs a Releaser on a fake clock with heap as its reading; each
// release is sent on the returned channel.
func start(t *testing.T, heap Heap) (*Releaser, *clocktesting.FakeClock, chan struct{}) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	r := New(quiet, clk)
	released := make(chan struct{}, 10)
	var mu sync.Mutex
	r.heap = func() Heap {
		mu.Lock()
		defer mu.Unlock()
		return heap
	}
	// A release leaves the live heap only.
	r.release = func() {
		mu.Lock()
		heap = Heap{Live: heap.Live, Objects: heap.Live}
		mu.Unlock()
		released <- struct{}{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
	return r, clk, released
}

// armed waits (bounded) until the releaser waits on a timer.
func armed(t *testing.T, clk *clocktesting.FakeClock) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !clk.HasWaiters(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the releaser never waited on a timer")
		}
	}
}

func releases(released chan struct{}, within time.Duration) int {
	n := 0
	timeout := time.After(within)
	for {
		select {
		case <-released:
			n++
		case <-timeout:
			return n
		}
	}
}

// synced is a sync that starts and ends.
func synced(r *Releaser) {
	r.Begin()
	r.End()
}

var worth = Heap{Live: 100 << 20, Objects: 150 << 20, Free: 50 << 20}

// TestReleaseAfterQuiet: one release once quiet has passed since the
// latest sync, none before, none without a sync.
func TestReleaseAfterQuiet(t *testing.T) {
	r, clk, released := start(t, worth)
	if n := releases(released, 50*time.Millisecond); n != 0 {
		t.Fatalf("%d releases without a sync", n)
	}
	synced(r)
	armed(t, clk)
	clk.Step(quiet / 2)
	synced(r) // a sync in the middle: the quiet period starts again
	clk.Step(quiet / 2)
	// The first timer fired; the releaser waits again, for what is left.
	armed(t, clk)
	if n := releases(released, 50*time.Millisecond); n != 0 {
		t.Fatalf("released %v after the latest sync, before the quiet period (%v) ended", quiet/2, quiet)
	}
	clk.Step(quiet / 2)
	if n := releases(released, time.Second); n != 1 {
		t.Fatalf("%d releases after the quiet period, want 1", n)
	}
	// Nothing more until the next sync.
	clk.Step(10 * quiet)
	if n := releases(released, 50*time.Millisecond); n != 0 {
		t.Fatalf("%d releases with no sync since the last", n)
	}
	// The next sync finds nothing worth releasing after it: none.
	synced(r)
	armed(t, clk)
	clk.Step(quiet)
	if n := releases(released, 100*time.Millisecond); n != 0 {
		t.Fatalf("%d releases after a quiet period with nothing retained, want none", n)
	}
}

// TestNotWorthIt: too little retained, or too little against the live
// heap, is left to the runtime.
func TestNotWorthIt(t *testing.T) {
	for _, h := range []Heap{
		{Live: 10 << 20, Objects: 12 << 20, Free: 8 << 20},    // 10 MiB < MinRetained
		{Live: 400 << 20, Objects: 420 << 20, Free: 60 << 20}, // 80 MiB < a quarter of 400
	} {
		r, clk, released := start(t, h)
		synced(r)
		armed(t, clk)
		clk.Step(quiet)
		if n := releases(released, 100*time.Millisecond); n != 0 {
			t.Errorf("%+v (retained %d MiB): %d releases, want none", h, h.Retained()>>20, n)
		}
	}
	if !worth.worthIt() {
		t.Errorf("%+v is not worth a release", worth)
	}
}

// sink keeps TestReadHeapAndRelease's allocations from being optimized away.
var sink [][]byte

// TestReadHeapAndRelease: the real runtime. Garbage shows as retained,
// and the real release returns most of it.
func TestReadHeapAndRelease(t *testing.T) {
	runtime.GC()
	base := readHeap()
	if base.Live == 0 || base.Objects == 0 {
		t.Fatalf("heap read as %+v", base)
	}
	for range 64 {
		sink = append(sink, make([]byte, 1<<20))
	}
	grown := readHeap()
	if grown.Objects < base.Objects+60<<20 {
		t.Fatalf("after allocating 64 MiB the heap's objects went from %d to %d MiB", base.Objects>>20, grown.Objects>>20)
	}
	sink = nil
	r := New(quiet, nil)
	r.release()
	after := readHeap()
	if after.Retained() >= 32<<20 {
		t.Errorf("after a release %d MiB retained (before: live %d, objects %d, free %d MiB)",
			after.Retained()>>20, grown.Live>>20, grown.Objects>>20, grown.Free>>20)
	}
}

// TestNoReleaseDuringASync: a sync longer than the quiet period holds the
// release back until it ends.
func TestNoReleaseDuringASync(t *testing.T) {
	r, clk, released := start(t, worth)
	synced(r)
	r.Begin() // the next sync starts at once and takes long
	armed(t, clk)
	clk.Step(quiet)
	if n := releases(released, 100*time.Millisecond); n != 0 {
		t.Fatalf("%d releases while a sync ran", n)
	}
	r.End()
	armed(t, clk)
	clk.Step(quiet)
	if n := releases(released, time.Second); n != 1 {
		t.Fatalf("%d releases after the long sync and a quiet period, want 1", n)
	}
}
