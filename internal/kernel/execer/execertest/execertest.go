// Package execertest scripts commands for unit tests of code that runs
// them through execer.Interface (nft, iptables-save/-restore).
package execertest

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kproxy/kproxy/internal/kernel/execer"
)

// Call is one expected command and what it answers.
type Call struct {
	Argv   []string
	Stdin  string
	Stdout string
	Stderr string // non-empty: the command fails with this stderr
}

// Script checks each command against Calls, in order, and plays back their
// answers. LookPath finds every binary in /usr/sbin except those in Missing
// (a path with a slash is found as it is).
type Script struct {
	T       testing.TB
	Missing map[string]bool
	Calls   []Call
}

var _ execer.Interface = (*Script)(nil)

// LookPath implements execer.Interface.
func (s *Script) LookPath(file string) (string, error) {
	if s.Missing[file] {
		return "", &exec.Error{Name: file, Err: exec.ErrNotFound}
	}
	if strings.Contains(file, "/") {
		return file, nil
	}
	return "/usr/sbin/" + file, nil
}

// Run implements execer.Interface.
func (s *Script) Run(_ context.Context, argv []string, stdin string) (string, error) {
	s.T.Helper()
	if len(s.Calls) == 0 {
		s.T.Fatalf("unexpected command %q", argv)
	}
	c := s.Calls[0]
	s.Calls = s.Calls[1:]
	if d := cmp.Diff(c.Argv, argv); d != "" {
		s.T.Errorf("argv (-want +got):\n%s", d)
	}
	if d := cmp.Diff(c.Stdin, stdin); d != "" {
		s.T.Errorf("stdin (-want +got):\n%s", d)
	}
	if c.Stderr != "" {
		return c.Stdout, &execer.RunError{Argv: argv, Stderr: c.Stderr, Err: errors.New("exit status 1")}
	}
	return c.Stdout, nil
}

// Done reports scripted commands that were not run.
func (s *Script) Done() {
	s.T.Helper()
	if len(s.Calls) > 0 {
		s.T.Errorf("%d scripted commands were not run, first %q", len(s.Calls), s.Calls[0].Argv)
	}
}
