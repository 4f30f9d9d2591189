// Package runner runs one sync function at a bounded frequency.
//
// It follows the contract of upstream kube-proxy's BoundedFrequencyRunner
// (pkg/proxy/runner) and kube-network-policies' runner:
//
//   - minInterval: at least this long passes between the end of one run and
//     the start of the next. Requests that arrive in between are coalesced
//     into a single run when the interval has passed.
//   - maxInterval: fn runs at least this often, even without requests, so a
//     periodic full resync happens.
//   - retryInterval: after fn fails, it runs again no later than this
//     (still never earlier than minInterval allows). A successful run cancels
//     the pending retry.
//   - RequestUrgent: a run as soon as the current one ends, cutting
//     minInterval's wait short: for a repair (rules changed behind the
//     proxy's back, its services broken meanwhile). Two urgent runs in a
//     row wait out minInterval as usual, so that a program fighting over
//     the rules cannot make the proxy sync back to back.
//   - RequestCleanup(after): a low-priority run, for work a run deferred
//     (kproxy's backends delete stale objects a second after they stopped
//     being used). It runs after the delay unless another run comes first
//     (every run does the deferred work it can), and it does not start a
//     minInterval of its own: a change that arrives right after it is not
//     held back by it. Upstream has no such run; it leaves stale chains to
//     the next sync, whenever that comes.
//   - ErrNotReady: fn returns it when it could do nothing yet (the proxy's
//     sources have not delivered their initial state). Such a run does not
//     count: it starts no minInterval and is not retried, so that the first
//     real run happens as soon as it is requested. Without this, a request
//     that arrived before the sources synced cost every start a whole
//     minInterval (kproxy waited ~1 s at start, the benchmark against
//     upstream found).
//
// fn never runs concurrently with itself: all runs happen on the goroutine
// that called Run.
package runner

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// ErrNotReady is what fn returns (possibly wrapped) when it could do
// nothing yet. The run then does not count: no minInterval follows it and
// it is not retried; the next request runs at once.
var ErrNotReady = errors.New("not ready to run")

// Runner calls fn at a bounded frequency. Create it with New and start it
// with Run.
type Runner struct {
	name          string
	fn            func() error
	minInterval   time.Duration
	maxInterval   time.Duration
	retryInterval time.Duration
	clk           clock.WithTicker

	// request holds at most one pending request. Created in New (not in Run)
	// so that a Request made before Run starts is kept, not dropped: the
	// proxier may ask for its first sync before the loop goroutine is
	// scheduled.
	request chan struct{}

	// cleanupSig wakes an idle loop to arm the clean-up timer;
	// cleanupWanted/cleanupAfter hold the earliest delay asked for.
	cleanupSig chan struct{}
	// urgent cuts a cooldown short (RequestUrgent).
	urgent        chan struct{}
	mu            sync.Mutex
	cleanupWanted bool
	cleanupAfter  time.Duration

	// waitHook, when set (tests only), is called on the Run goroutine right
	// before it blocks, after every timer it waits on has been armed. Tests
	// use it to step a fake clock without racing the loop.
	waitHook func(state)
}

// state says what the loop is about to wait for. Only used by waitHook.
type state int

const (
	// stateIdle: waiting for a request, the max interval or a retry.
	stateIdle state = iota
	// stateCooldown: a run just ended; waiting for minInterval to pass.
	stateCooldown
	// stateCleanup: fn is about to run for a clean-up request alone.
	stateCleanup
)

func (s state) String() string {
	switch s {
	case stateIdle:
		return "idle"
	case stateCooldown:
		return "cooldown"
	case stateCleanup:
		return "cleanup"
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// New returns a Runner for fn. name is used in logs. minInterval may be 0
// (no rate limit). maxInterval must be positive and not smaller than
// minInterval; retryInterval must be positive. Invalid intervals are a
// programming error (configuration is validated before this point), so New
// panics on them rather than run a loop with surprising timing.
func New(name string, fn func() error, minInterval, maxInterval, retryInterval time.Duration, clk clock.WithTicker) *Runner {
	switch {
	case fn == nil:
		panic(fmt.Sprintf("runner %q: fn must not be nil", name))
	case clk == nil:
		panic(fmt.Sprintf("runner %q: clock must not be nil", name))
	case minInterval < 0:
		panic(fmt.Sprintf("runner %q: minInterval (%v) must not be negative", name, minInterval))
	case maxInterval <= 0 || maxInterval < minInterval:
		panic(fmt.Sprintf("runner %q: maxInterval (%v) must be positive and >= minInterval (%v)", name, maxInterval, minInterval))
	case retryInterval <= 0:
		panic(fmt.Sprintf("runner %q: retryInterval (%v) must be positive", name, retryInterval))
	}
	return &Runner{
		name:          name,
		fn:            fn,
		minInterval:   minInterval,
		maxInterval:   maxInterval,
		retryInterval: retryInterval,
		clk:           clk,
		request:       make(chan struct{}, 1),
		cleanupSig:    make(chan struct{}, 1),
		urgent:        make(chan struct{}, 1),
	}
}

// Request asks for a run as soon as minInterval allows. It never blocks.
// Any number of requests made before the next run starts result in one
// run. A request made while fn is running results in exactly one more run
// after the current one (fn may have read its input before the change that
// prompted the request).
func (r *Runner) Request() {
	select {
	case r.request <- struct{}{}:
	default:
		// A request is already pending; this one is covered by it.
	}
}

// RequestUrgent asks for a run as soon as the current one (if any) ends,
// without waiting for the rest of minInterval, unless the run before was
// urgent too. It never blocks.
func (r *Runner) RequestUrgent() {
	select {
	case r.urgent <- struct{}{}:
	default:
	}
	r.Request()
}

// RequestCleanup asks for a low-priority run after the given delay (the
// earliest of several wins). Any run that starts before then covers it. A
// run made for it alone is not followed by minInterval's wait. It never
// blocks and may be called from fn.
func (r *Runner) RequestCleanup(after time.Duration) {
	r.mu.Lock()
	if !r.cleanupWanted || after < r.cleanupAfter {
		r.cleanupAfter = after
	}
	r.cleanupWanted = true
	r.mu.Unlock()
	select {
	case r.cleanupSig <- struct{}{}:
	default:
	}
}

// takeCleanup returns the pending clean-up delay, if any, and clears it.
func (r *Runner) takeCleanup() (time.Duration, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	d, ok := r.cleanupAfter, r.cleanupWanted
	r.cleanupWanted = false
	return d, ok
}

// Run runs the loop until ctx is done. It does not run fn on its own at
// start: the first run happens on the first Request (callers request it once
// their informers have synced) or after maxInterval. If ctx is cancelled
// while fn runs, Run returns once fn has returned.
func (r *Runner) Run(ctx context.Context) {
	klog.V(3).InfoS("Starting bounded-frequency runner", "name", r.name,
		"minInterval", r.minInterval, "maxInterval", r.maxInterval, "retryInterval", r.retryInterval)
	defer klog.V(3).InfoS("Stopped bounded-frequency runner", "name", r.name)

	maxTimer := r.clk.NewTimer(r.maxInterval)
	defer maxTimer.Stop()
	// The retry timer is only armed after a failure.
	retryTimer := r.clk.NewTimer(r.retryInterval)
	stopTimer(retryTimer)
	defer retryTimer.Stop()
	// The clean-up timer is armed by RequestCleanup.
	// An armed timer is only ever brought forward, never postponed.
	cleanupTimer := r.clk.NewTimer(time.Hour)
	stopTimer(cleanupTimer)
	defer cleanupTimer.Stop()
	var cleanupDue time.Time // zero: not armed
	armCleanup := func() {
		select {
		case <-r.cleanupSig:
		default:
		}
		d, ok := r.takeCleanup()
		if !ok {
			return
		}
		due := r.clk.Now().Add(d)
		if cleanupDue.IsZero() || due.Before(cleanupDue) {
			stopTimer(cleanupTimer)
			cleanupTimer.Reset(d)
			cleanupDue = due
		}
	}

	lastCut := false // the last cooldown was cut short by RequestUrgent
	for {
		armCleanup()
		r.hook(stateIdle)
		cleanupOnly := false
		select {
		case <-ctx.Done():
			return
		case <-r.request:
		case <-maxTimer.C():
		case <-retryTimer.C():
		case <-cleanupTimer.C():
			cleanupOnly = true
		case <-r.cleanupSig:
			// Arm the timer (at the top of the loop), then wait again.
			continue
		}

		// Whatever triggered this run, it covers the other triggers too:
		// disarm them so that none of them causes a second, redundant run.
		stopTimer(maxTimer)
		stopTimer(retryTimer)
		stopTimer(cleanupTimer)
		cleanupDue = time.Time{}
		// A request pending now was made before fn starts, so this run
		// covers it (and is not a clean-up run any more). A request made
		// while fn runs stays queued. Clean-up asked for before the run is
		// covered by it; fn asks again if it deferred more.
		select {
		case <-r.request:
			cleanupOnly = false
		default:
		}
		select {
		case <-r.cleanupSig:
		default:
		}
		r.takeCleanup()
		// An urgent request made before this run is covered by it.
		select {
		case <-r.urgent:
		default:
		}
		if cleanupOnly {
			r.hook(stateCleanup)
		}

		err := r.runOnce()
		// The max interval counts from the end of this run, as upstream does.
		maxTimer.Reset(r.maxInterval)
		if errors.Is(err, ErrNotReady) {
			// Nothing was done: the next request must not wait.
			klog.V(4).InfoS("Run skipped, not ready", "name", r.name, "reason", err)
			continue
		}
		if err != nil {
			klog.ErrorS(err, "Sync failed, will retry", "name", r.name, "retryInterval", r.retryInterval)
			retryTimer.Reset(r.retryInterval)
		}
		armCleanup()

		// A clean-up run comes after minInterval has passed since the
		// last other run, so skipping the wait keeps that spacing.
		if r.minInterval > 0 && !cleanupOnly {
			minTimer := r.clk.NewTimer(r.minInterval)
			r.hook(stateCooldown)
			urgent := r.urgent
			if lastCut {
				urgent = nil // two urgent runs in a row: wait it out
			}
			lastCut = false
			select {
			case <-ctx.Done():
				minTimer.Stop()
				return
			case <-minTimer.C():
			case <-urgent:
				minTimer.Stop()
				lastCut = true
			}
		}
	}
}

// runOnce calls fn, turning a panic into an error: a bug in one sync must
// not take the whole proxy down; the retry gives it another chance and the
// error is logged with its stack-less value.
func (r *Runner) runOnce() (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("sync function panicked: %v", p)
		}
	}()
	return r.fn()
}

func (r *Runner) hook(s state) {
	if r.waitHook != nil {
		r.waitHook(s)
	}
}

// stopTimer stops t and drops a value it may already have delivered, so that
// a later Reset never sees a stale expiry. (Fake clock timers have a
// buffered channel and are not drained by Stop.)
func stopTimer(t clock.Timer) {
	if !t.Stop() {
		select {
		case <-t.C():
		default:
		}
	}
}
