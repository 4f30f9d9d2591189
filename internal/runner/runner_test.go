package runner

// These tests drive the runner with a fake clock and observe it through one
// ordered stream of events:
//
//	"idle"      the loop is about to wait for a request, maxInterval or a retry
//	"cooldown"  a run ended; the loop is about to wait for minInterval
//	"run <d>"   fn started, d = fake time since the test started
//
// Events are emitted on the loop goroutine before it blocks, after its timers
// are armed, so a test can step the clock right after seeing one without
// racing the loop. Every wait is bounded by waitTimeout.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"
)

const waitTimeout = 10 * time.Second

// outcome scripts one call of fn.
type outcome struct {
	err   error
	panic bool
	block bool // wait for action.release before returning
	// cleanup > 0: fn asks for a clean-up run after this long.
	cleanup time.Duration
}

// action is one step of a scenario: first the requests, then the release of
// a blocked fn, then the clock step; afterwards exactly want events follow.
type action struct {
	requests int
	cleanup  time.Duration // RequestCleanup from outside fn
	urgent   int           // RequestUrgent calls
	release  bool
	step     time.Duration
	want     []string
}

type scenario struct {
	name              string
	min, max, retry   time.Duration
	outcomes          []outcome // fn results in order; later calls succeed
	requestsBeforeRun int
	startWant         []string // events after Run starts
	actions           []action
}

var errSync = errors.New("sync failed")

func TestRunner(t *testing.T) {
	scenarios := []scenario{{
		// A drift repair must not wait out the min interval of the sync
		// that just ran (the drift test saw repairs a second late), but a
		// program fighting over the rules must not make syncs back to
		// back either.
		name: "urgent requests cut the cooldown, not twice in a row",
		min:  time.Second, max: time.Hour, retry: 10 * time.Second,
		startWant: []string{"idle"},
		actions: []action{
			{requests: 1, want: []string{"run 0s", "cooldown"}},
			{step: 200 * time.Millisecond, urgent: 1, want: []string{"idle", "run 200ms", "cooldown"}},
			{urgent: 1, want: nil},
			{step: 999 * time.Millisecond, want: nil},
			{step: time.Millisecond, want: []string{"idle", "run 1.2s", "cooldown"}},
			// The cooldown after a normal run can be cut again.
			{urgent: 1, want: []string{"idle", "run 1.2s", "cooldown"}},
			{step: time.Second, want: []string{"idle"}},
			// Idle: an urgent request is a request.
			{urgent: 1, want: []string{"run 2.2s", "cooldown"}},
			{step: time.Second, want: []string{"idle"}},
			{step: time.Minute, want: nil},
		},
	}, {
		// The benchmark against upstream found changes 1.5 s apart waiting
		// 0.45 s: the clean-up run a second after each change started a
		// min interval of its own.
		name: "a clean-up run does not hold back the next change",
		min:  time.Second, max: time.Hour, retry: 10 * time.Second,
		outcomes:  []outcome{{cleanup: time.Second}},
		startWant: []string{"idle"},
		actions: []action{
			{requests: 1, want: []string{"run 0s", "cooldown"}},
			{step: time.Second, want: []string{"idle", "cleanup", "run 1s", "idle"}},
			{step: 500 * time.Millisecond, want: nil},
			{requests: 1, want: []string{"run 1.5s", "cooldown"}},
			{step: time.Second, want: []string{"idle"}},
			{step: time.Minute, want: nil},
		},
	}, {
		name: "a change before the clean-up delay covers it",
		min:  time.Second, max: time.Hour, retry: 10 * time.Second,
		outcomes:  []outcome{{cleanup: 2 * time.Second}},
		startWant: []string{"idle"},
		actions: []action{
			{requests: 1, want: []string{"run 0s", "cooldown"}},
			{step: time.Second, want: []string{"idle"}},
			{step: 500 * time.Millisecond, requests: 1, want: []string{"run 1.5s", "cooldown"}},
			{step: time.Second, want: []string{"idle"}},
			// The clean-up timer was disarmed by the run at 1.5s.
			{step: time.Minute, want: nil},
		},
	}, {
		name: "clean-up runs that ask again are spaced by their delay",
		min:  time.Second, max: time.Hour, retry: 10 * time.Second,
		outcomes:  []outcome{{cleanup: time.Second}, {cleanup: time.Second}},
		startWant: []string{"idle"},
		actions: []action{
			{requests: 1, want: []string{"run 0s", "cooldown"}},
			{step: time.Second, want: []string{"idle", "cleanup", "run 1s", "idle"}},
			{step: 999 * time.Millisecond, want: nil},
			{step: time.Millisecond, want: []string{"cleanup", "run 2s", "idle"}},
			{step: time.Minute, want: nil},
		},
	}, {
		name: "clean-up asked for from outside a run",
		min:  time.Second, max: time.Hour, retry: 10 * time.Second,
		startWant: []string{"idle"},
		actions: []action{
			{cleanup: 3 * time.Second, want: []string{"idle"}},
			{step: 2 * time.Second, cleanup: 5 * time.Second, want: []string{"idle"}},
			// The later ask (5s from 2s) does not postpone the earlier one.
			{step: 999 * time.Millisecond, want: nil},
			{step: time.Millisecond, want: []string{"cleanup", "run 3s", "idle"}},
			{step: time.Minute, want: nil},
		},
	}, {
		name: "min interval respected between runs",
		min:  time.Second, max: time.Hour, retry: 10 * time.Second,
		startWant: []string{"idle"},
		actions: []action{
			{requests: 1, want: []string{"run 0s", "cooldown"}},
			{requests: 1, want: nil},
			{step: 999 * time.Millisecond, want: nil},
			{step: time.Millisecond, want: []string{"idle", "run 1s", "cooldown"}},
			{step: time.Second, want: []string{"idle"}},
			// Long after the last run, a request runs at once.
			{step: 5 * time.Second},
			{requests: 1, want: []string{"run 7s", "cooldown"}},
		},
	}, {
		name: "zero min interval runs every request at once",
		min:  0, max: time.Hour, retry: 10 * time.Second,
		startWant: []string{"idle"},
		actions: []action{
			{requests: 1, want: []string{"run 0s", "idle"}},
			{requests: 1, want: []string{"run 0s", "idle"}},
		},
	}, {
		name: "burst during cooldown coalesces into one run",
		min:  time.Second, max: time.Hour, retry: 10 * time.Second,
		startWant: []string{"idle"},
		actions: []action{
			{requests: 1, want: []string{"run 0s", "cooldown"}},
			{requests: 50, want: nil},
			{step: time.Second, want: []string{"idle", "run 1s", "cooldown"}},
			{step: time.Second, want: []string{"idle"}},
			{step: time.Minute, want: nil},
		},
	}, {
		// kproxy's first sync waited out a whole min interval: a change
		// that arrived before the sources had synced made a run that could
		// do nothing, and the run the synced sources asked for waited
		// for the cooldown of that one.
		name: "a run that was not ready starts no cooldown",
		min:  time.Second, max: time.Hour, retry: 10 * time.Second,
		outcomes:  []outcome{{err: ErrNotReady}, {err: fmt.Errorf("sources: %w", ErrNotReady)}},
		startWant: []string{"idle"},
		actions: []action{
			{requests: 1, want: []string{"run 0s", "idle"}},
			{step: 100 * time.Millisecond, requests: 1, want: []string{"run 100ms", "idle"}},
			// Ready now: runs at once, and this run's cooldown applies.
			{requests: 1, want: []string{"run 100ms", "cooldown"}},
			{requests: 1, want: nil},
			{step: time.Second, want: []string{"idle", "run 1.1s", "cooldown"}},
			{step: time.Second, want: []string{"idle"}},
			// Not ready is not a failure: nothing was retried.
			{step: time.Minute, want: nil},
		},
	}, {
		name: "a periodic run that was not ready is not retried and keeps the period",
		min:  time.Second, max: 10 * time.Second, retry: 5 * time.Second,
		outcomes:  []outcome{{err: ErrNotReady}},
		startWant: []string{"idle"},
		actions: []action{
			{step: 10 * time.Second, want: []string{"run 10s", "idle"}},
			{step: 9999 * time.Millisecond, want: nil},
			{step: time.Millisecond, want: []string{"run 20s", "cooldown"}},
		},
	}, {
		name: "requests before Run are kept and coalesced",
		min:  time.Second, max: time.Hour, retry: 10 * time.Second,
		requestsBeforeRun: 5,
		startWant:         []string{"idle", "run 0s", "cooldown"},
		actions: []action{
			{step: time.Second, want: []string{"idle"}},
			{step: time.Minute, want: nil},
		},
	}, {
		name: "max interval runs periodically without requests",
		min:  time.Second, max: 10 * time.Second, retry: 5 * time.Second,
		startWant: []string{"idle"},
		actions: []action{
			{step: 9999 * time.Millisecond, want: nil},
			{step: time.Millisecond, want: []string{"run 10s", "cooldown"}},
			{step: time.Second, want: []string{"idle"}},
			{step: 8 * time.Second, want: nil},
			{step: time.Second, want: []string{"run 20s", "cooldown"}},
		},
	}, {
		name: "max interval counts from the last run",
		min:  time.Second, max: 10 * time.Second, retry: 5 * time.Second,
		startWant: []string{"idle"},
		actions: []action{
			{step: 4 * time.Second},
			{requests: 1, want: []string{"run 4s", "cooldown"}},
			{step: time.Second, want: []string{"idle"}},
			// 10s after start: no periodic run, the request reset it.
			{step: 5 * time.Second, want: nil},
			{step: 4 * time.Second, want: []string{"run 14s", "cooldown"}},
		},
	}, {
		name: "retry after failure, success stops retrying",
		min:  time.Second, max: time.Minute, retry: 5 * time.Second,
		outcomes:  []outcome{{err: errSync}},
		startWant: []string{"idle"},
		actions: []action{
			{requests: 1, want: []string{"run 0s", "cooldown"}},
			{step: time.Second, want: []string{"idle"}},
			{step: 3999 * time.Millisecond, want: nil},
			{step: time.Millisecond, want: []string{"run 5s", "cooldown"}},
			{step: time.Second, want: []string{"idle"}},
			// No retry at 10s; the next run is the periodic one at 5s+1m.
			{step: 58 * time.Second, want: nil},
			{step: time.Second, want: []string{"run 1m5s", "cooldown"}},
		},
	}, {
		name: "repeated failures keep retrying",
		min:  time.Second, max: time.Minute, retry: 5 * time.Second,
		outcomes:  []outcome{{err: errSync}, {err: errSync}},
		startWant: []string{"idle"},
		actions: []action{
			{requests: 1, want: []string{"run 0s", "cooldown"}},
			{step: time.Second, want: []string{"idle"}},
			{step: 4 * time.Second, want: []string{"run 5s", "cooldown"}},
			{step: time.Second, want: []string{"idle"}},
			{step: 4 * time.Second, want: []string{"run 10s", "cooldown"}},
			{step: time.Second, want: []string{"idle"}},
			{step: 10 * time.Second, want: nil},
		},
	}, {
		name: "earlier request supersedes the retry",
		min:  time.Second, max: time.Minute, retry: 5 * time.Second,
		outcomes:  []outcome{{err: errSync}},
		startWant: []string{"idle"},
		actions: []action{
			{requests: 1, want: []string{"run 0s", "cooldown"}},
			{step: time.Second, want: []string{"idle"}},
			{step: time.Second},
			{requests: 1, want: []string{"run 2s", "cooldown"}},
			{step: time.Second, want: []string{"idle"}},
			{step: 10 * time.Second, want: nil},
		},
	}, {
		name: "retry shorter than min interval waits for min interval",
		min:  time.Second, max: time.Minute, retry: 100 * time.Millisecond,
		outcomes:  []outcome{{err: errSync}},
		startWant: []string{"idle"},
		actions: []action{
			{requests: 1, want: []string{"run 0s", "cooldown"}},
			{step: 500 * time.Millisecond, want: nil},
			{step: 500 * time.Millisecond, want: []string{"idle", "run 1s", "cooldown"}},
			{step: time.Second, want: []string{"idle"}},
		},
	}, {
		// Retry and request are both pending when the cooldown ends: one run
		// covers both, whichever the loop picks first.
		name: "retry and pending request coalesce",
		min:  time.Second, max: time.Hour, retry: time.Second,
		outcomes:  []outcome{{err: errSync}},
		startWant: []string{"idle"},
		actions: []action{
			{requests: 1, want: []string{"run 0s", "cooldown"}},
			{requests: 1, want: nil},
			{step: time.Second, want: []string{"idle", "run 1s", "cooldown"}},
			{step: time.Second, want: []string{"idle"}},
			{step: time.Minute, want: nil},
		},
	}, {
		name: "panic in fn is a failure and is retried",
		min:  time.Second, max: time.Minute, retry: 5 * time.Second,
		outcomes:  []outcome{{panic: true}},
		startWant: []string{"idle"},
		actions: []action{
			{requests: 1, want: []string{"run 0s", "cooldown"}},
			{step: time.Second, want: []string{"idle"}},
			{step: 4 * time.Second, want: []string{"run 5s", "cooldown"}},
		},
	}, {
		name: "requests during a run lead to exactly one more run",
		min:  time.Second, max: time.Hour, retry: 10 * time.Second,
		outcomes:  []outcome{{block: true}},
		startWant: []string{"idle"},
		actions: []action{
			{requests: 1, want: []string{"run 0s"}},
			{requests: 3, want: nil},
			{release: true, want: []string{"cooldown"}},
			{step: time.Second, want: []string{"idle", "run 1s", "cooldown"}},
			{step: time.Second, want: []string{"idle"}},
			{step: time.Minute, want: nil},
		},
	}, {
		name: "no request during a run, no extra run",
		min:  time.Second, max: time.Hour, retry: 10 * time.Second,
		outcomes:  []outcome{{block: true}},
		startWant: []string{"idle"},
		actions: []action{
			{requests: 1, want: []string{"run 0s"}},
			{release: true, want: []string{"cooldown"}},
			{step: time.Second, want: []string{"idle"}},
			{step: time.Minute, want: nil},
		},
	}}

	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			runScenario(t, sc)
		})
	}
}

func runScenario(t *testing.T, sc scenario) {
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(start)
	events := make(chan string, 1000)
	release := make(chan struct{})
	done := make(chan struct{})
	calls := 0
	var r *Runner

	fn := func() error {
		// Runs on the loop goroutine only; calls needs no lock.
		o := outcome{}
		if calls < len(sc.outcomes) {
			o = sc.outcomes[calls]
		}
		calls++
		events <- fmt.Sprintf("run %v", clk.Since(start))
		if o.block {
			select {
			case <-release:
			case <-done:
			}
		}
		if o.cleanup > 0 {
			r.RequestCleanup(o.cleanup)
		}
		if o.panic {
			panic("boom")
		}
		return o.err
	}

	r = New("test", fn, sc.min, sc.max, sc.retry, clk)
	r.waitHook = func(s state) { events <- s.String() }

	for i := 0; i < sc.requestsBeforeRun; i++ {
		r.Request()
	}

	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		r.Run(ctx)
	}()
	t.Cleanup(func() {
		close(done)
		cancel()
		select {
		case <-stopped:
		case <-time.After(waitTimeout):
			t.Errorf("Run did not return after the context was cancelled")
		}
	})

	expectEvents(t, "start", events, sc.startWant)
	for i, a := range sc.actions {
		for j := 0; j < a.requests; j++ {
			r.Request()
		}
		if a.cleanup > 0 {
			r.RequestCleanup(a.cleanup)
		}
		for j := 0; j < a.urgent; j++ {
			r.RequestUrgent()
		}
		if a.release {
			release <- struct{}{}
		}
		if a.step > 0 {
			clk.Step(a.step)
		}
		expectEvents(t, fmt.Sprintf("action %d", i), events, a.want)
	}
}

// expectEvents waits for exactly want, then checks that nothing else is
// queued. The loop is blocked after the last expected event, so an extra
// event here is a real bug, not timing.
func expectEvents(t *testing.T, what string, events <-chan string, want []string) {
	t.Helper()
	var got []string
	timeout := time.After(waitTimeout)
	for len(got) < len(want) {
		select {
		case e := <-events:
			got = append(got, e)
		case <-timeout:
			t.Fatalf("%s: timed out; got events %q, want %q", what, got, want)
		}
	}
	select {
	case e := <-events:
		got = append(got, e)
	default:
	}
	if diff := cmp.Diff(want, got, cmpEmptyIsNil); diff != "" {
		t.Fatalf("%s: events (-want +got):\n%s", what, diff)
	}
}

var cmpEmptyIsNil = cmp.Transformer("emptyIsNil", func(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
})

func TestRunReturnsOnCancel(t *testing.T) {
	for _, tc := range []struct {
		name    string
		min     time.Duration
		request bool
		want    []string
	}{
		{name: "while idle", min: time.Second, want: []string{"idle"}},
		{name: "during cooldown", min: time.Second, request: true, want: []string{"idle", "run", "cooldown"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Unix(0, 0))
			events := make(chan string, 100)
			r := New("test", func() error { events <- "run"; return nil }, tc.min, time.Hour, time.Minute, clk)
			r.waitHook = func(s state) { events <- s.String() }
			if tc.request {
				r.Request()
			}
			ctx, cancel := context.WithCancel(context.Background())
			stopped := make(chan struct{})
			go func() {
				defer close(stopped)
				r.Run(ctx)
			}()
			expectEvents(t, "before cancel", events, tc.want)
			cancel()
			select {
			case <-stopped:
			case <-time.After(waitTimeout):
				t.Fatal("Run did not return after cancel")
			}
			// The loop stopped its timers: nothing is left waiting on the clock.
			if n := clk.Waiters(); n != 0 {
				t.Errorf("fake clock has %d waiters after Run returned, want 0", n)
			}
		})
	}
}

func TestNewRejectsInvalidIntervals(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	fn := func() error { return nil }
	for _, tc := range []struct {
		name            string
		min, max, retry time.Duration
	}{
		{"negative min", -time.Second, time.Minute, time.Second},
		{"zero max", 0, 0, time.Second},
		{"max below min", time.Minute, time.Second, time.Second},
		{"zero retry", time.Second, time.Minute, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("New(%v, %v, %v) did not panic", tc.min, tc.max, tc.retry)
				}
			}()
			New("test", fn, tc.min, tc.max, tc.retry, clk)
		})
	}
}
