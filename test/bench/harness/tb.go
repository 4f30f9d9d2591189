// Package harness runs kproxy-bench's measurements: kproxy (and any
// kube-proxy-compatible binary) on generated clusters (test/bench/cluster),
// with the file source in a fresh network namespace and side by side
// against a real kube-apiserver (test/e2e/framework), plus the data plane
// through their rules. test/bench/cmd/kproxy-bench is its command line;
// a short run of it is a test (test/bench/harness_test.go).
package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"testing"
	"time"
)

// errFatal is what Fatal panics with; Scope recovers it.
type errFatal struct{ msg string }

// TB lets a program use the helpers of test/e2e/framework, which take a
// testing.TB: Fatal ends the current Scope, Cleanup runs when the Scope
// ends (in reverse order, also after Fatal or a panic), TempDir is removed
// then. The embedded nil testing.TB only satisfies the interface's private
// method; every method the framework calls is defined here.
type TB struct {
	testing.TB
	ctx    context.Context
	log    io.Writer
	name   string
	mu     sync.Mutex
	clean  []func()
	failed bool
}

// NewTB returns a TB whose Logf writes to log (with the time) and whose
// Fatal also happens once ctx is done (checked by Check).
func NewTB(ctx context.Context, log io.Writer, name string) *TB {
	return &TB{ctx: ctx, log: log, name: name}
}

// Scope runs f with a TB of its own: its cleanups run when f returns. A
// Fatal inside f is returned as an error.
func (t *TB) Scope(name string, f func(*TB)) (err error) {
	child := &TB{ctx: t.ctx, log: t.log, name: t.name + "/" + name}
	defer func() {
		if r := recover(); r != nil {
			var fe errFatal
			if !errors.As(asError(r), &fe) {
				child.runCleanups()
				panic(r)
			}
			child.failed = true
			err = fmt.Errorf("%s: %s", child.name, fe.msg)
		}
		child.runCleanups()
	}()
	f(child)
	return nil
}

func asError(r any) error {
	if fe, ok := r.(errFatal); ok {
		return fe
	}
	return fmt.Errorf("%v", r)
}

func (e errFatal) Error() string { return e.msg }

func (t *TB) runCleanups() {
	for {
		t.mu.Lock()
		if len(t.clean) == 0 {
			t.mu.Unlock()
			return
		}
		f := t.clean[len(t.clean)-1]
		t.clean = t.clean[:len(t.clean)-1]
		t.mu.Unlock()
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Logf("cleanup: %v", r)
				}
			}()
			f()
		}()
	}
}

// Context is done when the run is interrupted.
func (t *TB) Context() context.Context { return t.ctx }

// Check ends the scope if the run was interrupted.
func (t *TB) Check() {
	if t.ctx.Err() != nil {
		t.Fatalf("interrupted")
	}
}

func (t *TB) Cleanup(f func()) { t.mu.Lock(); t.clean = append(t.clean, f); t.mu.Unlock() }
func (t *TB) Helper()          {}
func (t *TB) Name() string     { return t.name }
func (t *TB) Failed() bool     { return t.failed }
func (t *TB) Fail()            { t.failed = true }
func (t *TB) FailNow()         { t.Fatalf("failed") }
func (t *TB) Log(a ...any)     { t.Logf("%s", fmt.Sprint(a...)) }
func (t *TB) Logf(f string, a ...any) {
	fmt.Fprintf(t.log, "%s %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(f, a...))
}
func (t *TB) Error(a ...any)            { t.failed = true; t.Log(a...) }
func (t *TB) Errorf(f string, a ...any) { t.failed = true; t.Logf(f, a...) }
func (t *TB) Fatal(a ...any)            { t.Fatalf("%s", fmt.Sprint(a...)) }
func (t *TB) Fatalf(f string, a ...any) {
	t.failed = true
	panic(errFatal{msg: fmt.Sprintf(f, a...)})
}
func (t *TB) Skip(a ...any)            { t.Fatalf("skipped: %s", fmt.Sprint(a...)) }
func (t *TB) Skipf(f string, a ...any) { t.Fatalf("skipped: "+f, a...) }
func (t *TB) SkipNow()                 { t.Fatalf("skipped") }
func (t *TB) Skipped() bool            { return false }

// TempDir is a new directory removed when the scope ends.
func (t *TB) TempDir() string {
	d, err := os.MkdirTemp("", "kproxy-bench-")
	if err != nil {
		t.Fatalf("TempDir: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}
