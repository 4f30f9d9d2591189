package proxy

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"

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
