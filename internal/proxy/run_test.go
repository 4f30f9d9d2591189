package proxy

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kproxy/kproxy/internal/model"
)

// signallingBackend reports each sync (trials aside) on a channel, and
// fails the next fails of them.
type signallingBackend struct {
	synced chan Request
	fails  atomic.Int32
}

func (b *signallingBackend) Sync(_ context.Context, r *Request) (*Result, error) {
	if r.Trial {
		// The loop looking for the service port to blame (isolate.go):
		// none is.
		return &Result{}, nil
	}
	fail := b.fails.Add(-1) >= 0
	b.synced <- Request{Full: r.Full, Changed: r.Changed.Clone()}
	if fail {
		return nil, errors.New("the kernel said no")
	}
	return &Result{}, nil
}

// TestLoopRun: Run syncs what Changed announces, runs AfterSync after
// each sync, retries a failed sync after RetryInterval without a change,
// and stops with its context.
func TestLoopRun(t *testing.T) {
	tr := model.NewTracker(model.TrackerOptions{Hostname: "node-a", Families: []v1.IPFamily{model.IPv4}})
	b := &signallingBackend{synced: make(chan Request, 16)}
	var after atomic.Int32
	l := New(Options{Tracker: tr, Backends: map[v1.IPFamily]Backend{model.IPv4: b}, Clock: clock.RealClock{},
		SyncPeriod: time.Hour, RetryInterval: 50 * time.Millisecond,
		AfterSync: func(context.Context) { after.Add(1) }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("Run did not stop with its context")
		}
	}()
	next := func(what string) Request {
		t.Helper()
		select {
		case r := <-b.synced:
			return r
		case <-time.After(5 * time.Second):
			t.Fatalf("no sync: %s", what)
		}
		return Request{}
	}

	tr.ServiceUpdated(makeService("a", "198.19.0.1"))
	tr.Synced()
	l.Changed()
	if r := next("after the first change"); !r.Full || r.Changed.Len() != 1 {
		t.Fatalf("first sync: full=%v changed=%v, want a full sync of 1 service port", r.Full, r.Changed)
	}

	// The sync of the next change fails, and so does the loop's full
	// sync without the suspects (isolate.go): the loop's Sync fails.
	b.fails.Store(2)
	tr.ServiceUpdated(makeService("b", "198.19.0.2"))
	l.Changed()
	next("after the second change (fails)")
	next("the full sync without suspects (fails)")
	// No change: the retry comes from RetryInterval, and is full.
	if r := next("the retry of the failed sync"); !r.Full {
		t.Fatalf("retry: full=%v, want full", r.Full)
	}
	// AfterSync follows each of the loop's syncs, failed or not.
	for deadline := time.Now().Add(5 * time.Second); after.Load() < 3 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if n := after.Load(); n != 3 {
		t.Errorf("AfterSync ran %d times after 3 syncs of the loop", n)
	}
}

// TestLoopRunFirstSyncAtOnce: the first sync runs as soon as the sources
// report synced, however many changes came before, without the clock
// moving: kproxy's start used to wait out a whole min-sync-period,
// because a change before the sources synced made the runner run (and
// then cool down) for nothing.
func TestLoopRunFirstSyncAtOnce(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	b := &signallingBackend{synced: make(chan Request, 16)}
	var l *Loop
	tr := model.NewTracker(model.TrackerOptions{Hostname: "node-a", Families: []v1.IPFamily{model.IPv4},
		OnChange: func() { l.Changed() }})
	l = New(Options{Tracker: tr, Backends: map[v1.IPFamily]Backend{model.IPv4: b}, Clock: clk,
		SyncPeriod: time.Hour, MinSyncPeriod: time.Second, RetryInterval: 10 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	// The initial list arrives; the runner has time to act on it.
	tr.NodeUpdated(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}})
	tr.ServiceUpdated(makeService("a", "198.19.0.1"))
	time.Sleep(100 * time.Millisecond)
	select {
	case r := <-b.synced:
		t.Fatalf("synced before the sources did: %+v", r)
	default:
	}
	tr.ServiceUpdated(makeService("b", "198.19.0.2"))
	tr.Synced()
	select {
	case r := <-b.synced:
		if !r.Full || r.Changed.Len() != 2 {
			t.Fatalf("first sync: full=%v changed=%v, want a full sync of 2 service ports", r.Full, r.Changed)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no sync when the sources synced (the clock did not move)")
	}
	// Later changes are paced by min-sync-period, as before.
	tr.ServiceUpdated(makeService("c", "198.19.0.3"))
	select {
	case r := <-b.synced:
		t.Fatalf("a change synced within min-sync-period of the first sync: %+v", r)
	case <-time.After(100 * time.Millisecond):
	}
	for deadline := time.Now().Add(5 * time.Second); !clk.HasWaiters() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	clk.Step(time.Second)
	select {
	case r := <-b.synced:
		if r.Full || r.Changed.Len() != 1 {
			t.Fatalf("second sync: full=%v changed=%v, want a partial sync of 1 service port", r.Full, r.Changed)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no sync after min-sync-period")
	}
}

// meetingBackend's Sync reports that it started, then waits until the
// test lets it go.
type meetingBackend struct {
	entered chan<- v1.IPFamily
	release <-chan struct{}
	f       v1.IPFamily
}

func (b *meetingBackend) Sync(context.Context, *Request) (*Result, error) {
	b.entered <- b.f
	<-b.release
	return &Result{}, nil
}

// TestLoopParallelFamilies: with ParallelFamilies, both families' syncs
// are under way at the same time (the first sync of a dual-stack node
// takes as long as its slower family); without it, one after the other.
func TestLoopParallelFamilies(t *testing.T) {
	for _, parallel := range []bool{true, false} {
		entered := make(chan v1.IPFamily, 2)
		release := make(chan struct{})
		fams := []v1.IPFamily{model.IPv4, model.IPv6}
		tr := model.NewTracker(model.TrackerOptions{Hostname: "node-a", Families: fams})
		backends := map[v1.IPFamily]Backend{}
		for _, f := range fams {
			backends[f] = &meetingBackend{entered: entered, release: release, f: f}
		}
		l := New(Options{Tracker: tr, Backends: backends, Clock: clock.RealClock{}, SyncPeriod: time.Hour, ParallelFamilies: parallel})
		tr.ServiceUpdated(makeService("a", "198.19.0.1"))
		tr.Synced()
		done := make(chan error)
		go func() { done <- l.Sync(context.Background()) }()

		var seen []v1.IPFamily
		timeout := time.After(5 * time.Second)
		if !parallel {
			timeout = time.After(200 * time.Millisecond)
		}
	wait:
		for len(seen) < 2 {
			select {
			case f := <-entered:
				seen = append(seen, f)
			case <-timeout:
				break wait
			}
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatalf("parallel=%v: %v", parallel, err)
		}
		switch {
		case parallel && len(seen) != 2:
			t.Errorf("parallel: only %v synced at once, want both families", seen)
		case !parallel && len(seen) != 1:
			t.Errorf("not parallel: %v synced at once, want one family at a time", seen)
		}
		if !parallel && len(seen) == 1 && seen[0] != model.IPv4 {
			t.Errorf("not parallel: %v synced first, want the primary family", seen[0])
		}
	}
}
