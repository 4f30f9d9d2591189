// Package execer is the one seam through which kproxy runs commands (nft,
// iptables-save/-restore): kernel adapters take an Interface, unit tests
// give them a scripted one, everything else gets OS.
package execer

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
)

// Interface runs commands.
type Interface interface {
	LookPath(file string) (string, error)
	// Run runs argv with stdin and returns stdout; a non-zero exit is a
	// *RunError carrying stderr.
	Run(ctx context.Context, argv []string, stdin string) (string, error)
}

// BytesRunner is an Interface that also takes stdin and gives stdout as
// bytes, sparing the copies of Run's strings: iptables-restore input and
// iptables-save output are tens of MB each at 10k services.
type BytesRunner interface {
	RunBytes(ctx context.Context, argv []string, stdin []byte) ([]byte, error)
}

// RunBytes runs argv through r: as bytes when r is a BytesRunner, else
// through Run (scripted runners of unit tests). stdin is only read.
func RunBytes(ctx context.Context, r Interface, argv []string, stdin []byte) ([]byte, error) {
	if br, ok := r.(BytesRunner); ok {
		return br.RunBytes(ctx, argv, stdin)
	}
	out, err := r.Run(ctx, argv, string(stdin))
	return []byte(out), err
}

// RunError is a command that ran and failed.
type RunError struct {
	Argv   []string
	Stderr string
	Err    error
}

func (e *RunError) Error() string {
	return fmt.Sprintf("%s: %v: %s", strings.Join(e.Argv, " "), e.Err, strings.TrimSpace(e.Stderr))
}

func (e *RunError) Unwrap() error { return e.Err }

// OS runs real commands.
type OS struct{}

var (
	_ Interface   = OS{}
	_ BytesRunner = OS{}
)

// LookPath implements Interface.
func (OS) LookPath(file string) (string, error) { return exec.LookPath(file) }

// Run implements Interface.
func (o OS) Run(ctx context.Context, argv []string, stdin string) (string, error) {
	out, err := o.run(ctx, argv, strings.NewReader(stdin))
	return out.String(), err
}

// RunBytes implements BytesRunner.
func (o OS) RunBytes(ctx context.Context, argv []string, stdin []byte) ([]byte, error) {
	out, err := o.run(ctx, argv, bytes.NewReader(stdin))
	return out.Bytes(), err
}

func (OS) run(ctx context.Context, argv []string, stdin io.Reader) (*bytes.Buffer, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stdout, stderr bytes.Buffer
	cmd.Stdin = stdin
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return &stdout, &RunError{Argv: argv, Stderr: stderr.String(), Err: err}
	}
	return &stdout, nil
}
