package xtables

import (
	"slices"

	kexec "github.com/kproxy/kproxy/internal/kernel/execer"
)

// execer runs commands; unit tests replace it to script argv and stdin.
type execer = kexec.Interface

type runError = kexec.RunError

type osExecer = kexec.OS

// Option configures FindLeftovers and CleanupLeftovers.
type Option func(*options)

type options struct {
	prefix []string
	exec   execer
}

// WithCommandPrefix runs the iptables binaries through another command,
// for example "ip", "netns", "exec", "NAME" to act in a network namespace.
func WithCommandPrefix(argv ...string) Option {
	return func(o *options) { o.prefix = slices.Clone(argv) }
}

func withExecer(x execer) Option { return func(o *options) { o.exec = x } }

func newOptions(opts []Option) *options {
	o := &options{exec: osExecer{}}
	for _, f := range opts {
		f(o)
	}
	return o
}
