// Package execer is the one seam through which kproxy runs commands (nft,
// iptables-save/-restore): kernel adapters take an Interface, unit tests
// give them a scripted one, everything else gets OS.
package execer

import (
	"bytes"
	"context"
	"fmt"
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

var _ Interface = OS{}

// LookPath implements Interface.
func (OS) LookPath(file string) (string, error) { return exec.LookPath(file) }

// Run implements Interface.
func (OS) Run(ctx context.Context, argv []string, stdin string) (string, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stdout, stderr bytes.Buffer
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), &RunError{Argv: argv, Stderr: stderr.String(), Err: err}
	}
	return stdout.String(), nil
}
