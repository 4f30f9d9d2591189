package execer

import (
	"context"
	"errors"
	"strings"
	"testing"
)

func TestOSRun(t *testing.T) {
	out, err := OS{}.Run(context.Background(), []string{"sh", "-c", "cat; echo err >&2"}, "hello")
	if err != nil || out != "hello" {
		t.Fatalf("Run = %q, %v", out, err)
	}
	_, err = OS{}.Run(context.Background(), []string{"sh", "-c", "echo oops >&2; exit 3"}, "")
	var re *RunError
	if !errors.As(err, &re) || re.Stderr != "oops\n" || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("failing command: %v (%#v)", err, re)
	}
	if _, err := (OS{}).LookPath("no-such-binary-kproxy"); err == nil {
		t.Fatal("LookPath found a missing binary")
	}
}

// stringsOnly is a runner without RunBytes, as unit tests' scripted ones.
type stringsOnly struct{ stdin string }

func (s *stringsOnly) LookPath(file string) (string, error) { return file, nil }
func (s *stringsOnly) Run(_ context.Context, argv []string, stdin string) (string, error) {
	s.stdin = stdin
	return "out:" + argv[0], nil
}

func TestRunBytes(t *testing.T) {
	out, err := RunBytes(context.Background(), OS{}, []string{"sh", "-c", "cat; echo err >&2"}, []byte("hello"))
	if err != nil || string(out) != "hello" {
		t.Fatalf("RunBytes(OS) = %q, %v", out, err)
	}
	_, err = RunBytes(context.Background(), OS{}, []string{"sh", "-c", "echo oops >&2; exit 3"}, nil)
	var re *RunError
	if !errors.As(err, &re) || re.Stderr != "oops\n" {
		t.Fatalf("failing command: %v (%#v)", err, re)
	}
	s := &stringsOnly{}
	out, err = RunBytes(context.Background(), s, []string{"x"}, []byte("in"))
	if err != nil || string(out) != "out:x" || s.stdin != "in" {
		t.Fatalf("RunBytes(strings only) = %q, %v; stdin %q", out, err, s.stdin)
	}
}
