// Package idlemem gives the heap a burst of work left behind back to the
// operating system once the proxy has been idle for a moment.
//
// Go's collector runs when the heap has grown to twice what was live after
// the previous collection, and its scavenger keeps free memory up to that
// goal. A proxy that has just synced and then waits for the next change
// allocates nothing, so no collection comes: what the sync left (garbage,
// and free pages up to the goal) stays in its RSS for as long as it is
// idle. Measured at 10k services after a soak of changes: a live heap of
// 125 MB, flat, while RSS went from 186 to 279 MiB, the difference free
// heap the runtime kept (docs/benchmarks.md). An operator reading the
// node's memory sees what kproxy needs only if that is returned.
//
// Releaser waits until no sync has happened for a quiet period and then,
// if the heap holds enough garbage and free memory to be worth it,
// collects and returns it (runtime/debug.FreeOSMemory). Under a steady
// stream of changes it does nothing: the collector paces itself then.
package idlemem

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Releaser returns idle heap memory after a quiet period. Create it with
// New, start Run, and call Begin before each sync and End after it.
type Releaser struct {
	quiet time.Duration
	clk   clock.WithTicker
	touch chan struct{}
	// last is when End was last called (UnixNano of clk's time); busy
	// counts the syncs under way.
	last atomic.Int64
	busy atomic.Int32

	// heap and release are runtime/metrics and debug.FreeOSMemory;
	// tests replace them.
	heap    func() Heap
	release func()
}

// Heap is what the release decision reads.
type Heap struct {
	// Live is the heap the last collection found live; Objects is the
	// heap's objects now, live or garbage not yet collected; Free is
	// free heap memory not yet returned to the operating system.
	Live, Objects, Free uint64
}

// Retained is what a release would give back, about: the garbage and
// the free memory.
func (h Heap) Retained() uint64 {
	garbage := uint64(0)
	if h.Objects > h.Live {
		garbage = h.Objects - h.Live
	}
	return garbage + h.Free
}

// worthIt: a release costs a full collection (at 10k services some tens
// of milliseconds of CPU), so it is made only for at least MinRetained
// bytes and a quarter of the live heap.
func (h Heap) worthIt() bool {
	r := h.Retained()
	return r >= MinRetained && r >= h.Live/4
}

// MinRetained is the least retained memory a release is made for.
const MinRetained = 16 << 20

// DefaultQuiet is how long no sync must happen before a release: longer
// than the gap between a sync and its follow-ups (the other family, the
// clean-up a second later), short enough that memory read at rest is
// what kproxy needs.
const DefaultQuiet = 2 * time.Second

// New returns a Releaser that releases once quiet has passed without a
// sync.
func New(quiet time.Duration, clk clock.WithTicker) *Releaser {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Releaser{quiet: quiet, clk: clk, touch: make(chan struct{}, 1), heap: readHeap, release: debug.FreeOSMemory}
}

// Begin says a sync starts: no release until it has ended.
func (r *Releaser) Begin() { r.busy.Add(1) }

// End says a sync has ended: the quiet period starts again.
func (r *Releaser) End() {
	r.busy.Add(-1)
	r.last.Store(r.clk.Now().UnixNano())
	select {
	case r.touch <- struct{}{}:
	default:
	}
}

// Run releases memory after each quiet period that follows an End, until
// ctx is done. A sync that takes longer than the quiet period holds the
// release back until it ends.
func (r *Releaser) Run(ctx context.Context) {
	for {
		// Idle until something happens.
		select {
		case <-ctx.Done():
			return
		case <-r.touch:
		}
		// Wait until quiet has passed since the latest End, however
		// many came meanwhile.
		wait := r.quiet
		for wait > 0 {
			t := r.clk.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C():
			}
			wait = r.quiet - r.clk.Since(time.Unix(0, r.last.Load()))
		}
		// An End that came during the wait is still in the channel: it
		// starts another wait, which ends in a release only if there
		// is something worth releasing again. A sync under way ends
		// with an End, which starts the wait again.
		if r.busy.Load() == 0 {
			r.maybeRelease()
		}
	}
}

func (r *Releaser) maybeRelease() {
	before := r.heap()
	if !before.worthIt() {
		klog.V(5).InfoS("Idle: heap memory not worth returning", "liveBytes", before.Live, "retainedBytes", before.Retained())
		return
	}
	start := time.Now()
	r.release()
	after := r.heap()
	klog.V(4).InfoS("Idle: returned heap memory to the operating system", "liveBytes", after.Live,
		"retainedBytes", before.Retained(), "retainedAfterBytes", after.Retained(), "seconds", time.Since(start).Seconds())
}

var heapMetrics = []string{"/gc/heap/live:bytes", "/memory/classes/heap/objects:bytes", "/memory/classes/heap/free:bytes"}

// readHeap reads Heap from runtime/metrics (no stop-the-world, unlike
// runtime.ReadMemStats).
func readHeap() Heap {
	s := make([]metrics.Sample, len(heapMetrics))
	for i, name := range heapMetrics {
		s[i].Name = name
	}
	metrics.Read(s)
	v := func(i int) uint64 {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return s[i].Value.Uint64()
	}
	return Heap{Live: v(0), Objects: v(1), Free: v(2)}
}
