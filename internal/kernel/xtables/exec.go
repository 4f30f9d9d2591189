package xtables

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
)

// execer runs commands; unit tests replace it to script argv and stdin.
type execer interface {
	LookPath(file string) (string, error)
	// Run runs argv with stdin and returns stdout; a non-zero exit is an
	// error carrying stderr (see runError).
	Run(ctx context.Context, argv []string, stdin string) (string, error)
}

// runError is a command that ran and failed.
type runError struct {
	argv   []string
	stderr string
	err    error
}

func (e *runError) Error() string {
	return fmt.Sprintf("%s: %v: %s", strings.Join(e.argv, " "), e.err, strings.TrimSpace(e.stderr))
}

func (e *runError) Unwrap() error { return e.err }

type osExecer struct{}

func (osExecer) LookPath(file string) (string, error) { return exec.LookPath(file) }

func (osExecer) Run(ctx context.Context, argv []string, stdin string) (string, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stdout, stderr bytes.Buffer
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), &runError{argv: argv, stderr: stderr.String(), err: err}
	}
	return stdout.String(), nil
}

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
