package xtables

import (
	"context"
	"slices"
	"time"

	kexec "github.com/kproxy/kproxy/internal/kernel/execer"
)

// execer runs commands; unit tests replace it to script argv and stdin.
type execer = kexec.Interface

type runError = kexec.RunError

type osExecer = kexec.OS

// Option configures New, Select, OtherBackendRules, FindLeftovers and
// CleanupLeftovers.
type Option func(*options)

type options struct {
	prefix   []string
	exec     execer
	lockWait time.Duration
	now      func() time.Time
	// lockProbe waits (at most max) for the xtables lock to be free and
	// says how long that took.
	lockProbe func(ctx context.Context, max time.Duration) (time.Duration, error)
}

// WithCommandPrefix runs the iptables binaries through another command,
// for example "ip", "netns", "exec", "NAME" to act in a network namespace.
func WithCommandPrefix(argv ...string) Option {
	return func(o *options) { o.prefix = slices.Clone(argv) }
}

// WithLockWait bounds the wait for the xtables lock of the legacy backend
// (default DefaultLockWait). iptables takes whole seconds: it is rounded
// up.
func WithLockWait(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.lockWait = d
		}
	}
}

func withExecer(x execer) Option { return func(o *options) { o.exec = x } }

func withClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

func withLockProbe(p func(context.Context, time.Duration) (time.Duration, error)) Option {
	return func(o *options) { o.lockProbe = p }
}

func newOptions(opts []Option) *options {
	o := &options{exec: osExecer{}, lockWait: DefaultLockWait, now: time.Now}
	for _, f := range opts {
		f(o)
	}
	if o.lockProbe == nil {
		o.lockProbe = func(ctx context.Context, max time.Duration) (time.Duration, error) {
			return waitForLock(ctx, lockFile(), max, o.now)
		}
	}
	return o
}
