package framework

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// How long a stopped process gets between SIGTERM and SIGKILL, and how long
// to wait for it to be reaped after SIGKILL.
const (
	stopGrace    = 15 * time.Second
	killDeadline = 30 * time.Second
)

// Process is a long-running program started by StartProcess inside a network
// namespace, its output going to a log file.
type Process struct {
	Name string
	// Log is the file holding its standard output and error.
	Log string
	// Killed is set by Stop when SIGTERM was not enough and SIGKILL ended
	// the process.
	Killed bool

	cmd  *exec.Cmd
	done chan struct{} // closed once the process has been reaped
	err  error         // its exit status, valid after done

	stopOnce sync.Once
}

// StartProcess runs argv inside the network namespace ns (`ip netns exec`,
// which execs argv[0] in place, so the process is argv[0] itself) with its
// output in dir/name.log; with ns "" argv runs as it is (for a program that
// must not get ip netns exec's private mount namespace: start it with
// `nsenter --net=/run/netns/NS`, which also execs in place). It is stopped in t.Cleanup (SIGTERM, then SIGKILL
// after a grace period); if the test failed, the end of its log is printed.
// PDEATHSIG ends it should the test binary die without running cleanups
// (for example on a -timeout panic).
func StartProcess(t Lifetime, ns, dir, name string, argv ...string) *Process {
	t.Helper()
	p, err := startProcess(t, ns, dir, name, argv...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return p
}

// startProcess is StartProcess with the process's lifetime tied to owner
// (a test, or the shared control plane's suite lifetime), returning an
// error instead of failing owner.
func startProcess(owner tb, ns, dir, name string, argv ...string) (*Process, error) {
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("creating %s: %w", logPath, err)
	}
	if ns != "" {
		argv = append([]string{"ip", "netns", "exec", ns}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := startOnSpawnerThread(cmd); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	logFile.Close() // the child holds its own copy
	p := &Process{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	owner.Cleanup(func() {
		if err := p.Stop(); err != nil {
			owner.Errorf("%v", err)
		}
		if p.Killed {
			owner.Logf("%s ignored SIGTERM for %s and was killed", p.Name, stopGrace)
		}
		if owner.Failed() {
			owner.Logf("last lines of %s:\n%s", logPath, p.Tail(40))
		}
	})
	return p, nil
}

// The kernel sends PDEATHSIG when the *thread* that forked the child exits,
// not the process. DialContextIn and ListenIn deliberately end OS threads,
// and any goroutine (a test's included) may be running on the thread that
// one of them is about to lock and end. So children are forked from one
// thread that is locked for the life of the test binary and runs nothing
// else.
var spawner struct {
	once sync.Once
	reqs chan func()
}

func startOnSpawnerThread(cmd *exec.Cmd) error {
	spawner.once.Do(func() {
		spawner.reqs = make(chan func())
		go func() {
			runtime.LockOSThread() // never unlocked: this thread must not end
			for f := range spawner.reqs {
				f()
			}
		}()
	})
	errc := make(chan error, 1)
	spawner.reqs <- func() { errc <- cmd.Start() }
	return <-errc
}

// Pid is the process's ID (argv[0] itself: ip netns exec execs in place).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Signal sends sig to the process (for example SIGKILL, to see what a crash
// leaves behind, or SIGSTOP/SIGCONT to freeze it). It does not wait; use
// Done. A process that has already exited is not an error.
func (p *Process) Signal(sig os.Signal) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signalling %s: %w", p.Name, err)
	}
	return nil
}

// ExitError is the process's exit status once Done is closed.
func (p *Process) ExitError() error {
	select {
	case <-p.done:
		return p.err
	default:
		return nil
	}
}

// Stop ends the process: SIGTERM, then SIGKILL after a grace period. It
// returns an error only if the process could not be reaped in time; an exit
// status from the signal is expected and not an error. Safe to call twice.
func (p *Process) Stop() error {
	var err error
	p.stopOnce.Do(func() {
		select {
		case <-p.done:
			return
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
			return
		case <-time.After(stopGrace):
		}
		_ = p.cmd.Process.Kill()
		select {
		case <-p.done:
			// A busy machine can keep kube-apiserver's graceful shutdown
			// past the grace period; it is gone, which is all a test needs.
			p.Killed = true
		case <-time.After(killDeadline):
			err = fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.Name, p.cmd.Process.Pid)
		}
	})
	return err
}

// Tail returns the last n lines of the process's log.
func (p *Process) Tail(n int) string {
	b, err := os.ReadFile(p.Log)
	if err != nil {
		return fmt.Sprintf("(reading log: %v)", err)
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// exitedError describes a process that ended while it should be running.
func (p *Process) exitedError() error {
	err := p.ExitError()
	if err == nil {
		err = errors.New("exit status 0")
	}
	return fmt.Errorf("%s exited early (%v); last lines of %s:\n%s", p.Name, err, p.Log,
		strings.TrimSpace(p.Tail(30)))
}
