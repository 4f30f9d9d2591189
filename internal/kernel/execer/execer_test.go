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
