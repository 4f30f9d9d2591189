package netns

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Process is a command running inside a namespace (via `ip netns exec`,
// which execs the command itself, so the pid is the command's), with its
// stdout and stderr appended to a log file.
type Process struct {
	Name    string
	LogPath string
	// Cgroup, when set, is the cgroup v2 directory every run starts in.
	Cgroup string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
}

// StopTimeout is how long Stop waits after SIGTERM before it sends SIGKILL.
const StopTimeout = 5 * time.Second

// QuitTimeout is how long Stop waits after SIGQUIT before SIGKILL.
const QuitTimeout = 2 * time.Second

// LogTailLines is how many log lines a failed test shows per process.
const LogTailLines = 60

// StackTailLines is how many log lines are shown when a process had to be
// stopped with SIGQUIT (its goroutine stacks).
const StackTailLines = 400

// StartProcess starts argv in the namespace. Its output goes to
// logDir/<name>.log (appended, so restarts keep one log). At the end of the
// test the process is stopped (SIGTERM, then SIGKILL after StopTimeout) and,
// if the test failed, the tail of its log is logged.
func StartProcess(t testing.TB, n *NS, name, logDir string, argv ...string) *Process {
	t.Helper()
	return StartProcessIn(t, n, "", name, logDir, argv...)
}

// StartProcessIn is StartProcess with the process (and each restart) born
// in the cgroup v2 directory cgroup ("" for the test's own): clone3 puts it
// there before it runs, so its memory is charged there from the start (a
// process moved later keeps the charges it made; `ip netns exec` remounts
// /sys, so the command could not join a cgroup mounted there itself).
func StartProcessIn(t testing.TB, n *NS, cgroup, name, logDir string, argv ...string) *Process {
	t.Helper()
	p := &Process{Name: name, LogPath: filepath.Join(logDir, name+".log"), Cgroup: cgroup}
	if err := p.start(n, argv); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			// A process that ignores SIGTERM is a bug of its own; show
			// the stacks SIGQUIT printed.
			t.Errorf("stopping %s: %v\n%s", p.Name, err, p.Tail(StackTailLines))
			return
		}
		if t.Failed() {
			t.Logf("last lines of %s (%s):\n%s", p.Name, p.LogPath, p.Tail(LogTailLines))
		}
	})
	return p
}

// Restart starts the process again with the same namespace and arguments
// after it has exited (Kill or Stop it first).
func (p *Process) Restart(n *NS, argv ...string) error {
	select {
	case <-p.doneChan():
	default:
		return fmt.Errorf("%s: restart while still running", p.Name)
	}
	return p.start(n, argv)
}

func (p *Process) doneChan() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

func (p *Process) start(n *NS, argv []string) error {
	f, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(f, "==== %s: %s (netns %s)\n", time.Now().Format(time.RFC3339Nano), strings.Join(argv, " "), n.Name)
	cmd := exec.Command("ip", append([]string{"netns", "exec", n.Name}, argv...)...)
	cmd.Stdout, cmd.Stderr = f, f
	// Its own process group: a ^C to the test does not hit it first, and
	// Stop signals exactly this process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if p.Cgroup != "" {
		cg, err := os.Open(p.Cgroup)
		if err != nil {
			f.Close()
			return fmt.Errorf("starting %s: its cgroup: %w", p.Name, err)
		}
		defer cg.Close()
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(cg.Fd())
	}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("starting %s in netns %s: %w", p.Name, n.Name, err)
	}
	done := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.done, p.waitErr = cmd, done, nil
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		f.Close()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// Pid is the process id of the current run.
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd.Process.Pid
}

// Exited reports whether the process has exited, and how.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.doneChan():
		p.mu.Lock()
		defer p.mu.Unlock()
		return true, p.waitErr
	default:
		return false, nil
	}
}

// Stop sends SIGTERM and waits up to StopTimeout. A process still running
// then gets SIGQUIT (a Go program prints every goroutine's stack to its
// log and exits, showing where it hung) and, after QuitTimeout, SIGKILL.
// Stopping an exited process is a no-op. The error is only about stopping
// (an exit status from SIGTERM is expected and not reported).
func (p *Process) Stop() error {
	done := p.doneChan()
	select {
	case <-done:
		return nil
	default:
	}
	p.mu.Lock()
	proc := p.cmd.Process
	p.mu.Unlock()
	_ = proc.Signal(syscall.SIGTERM)
	select {
	case <-done:
		return nil
	case <-time.After(StopTimeout):
	}
	_ = proc.Signal(syscall.SIGQUIT)
	select {
	case <-done:
		return fmt.Errorf("did not exit within %v of SIGTERM; sent SIGQUIT (stacks in %s)", StopTimeout, p.LogPath)
	case <-time.After(QuitTimeout):
	}
	_ = proc.Kill()
	select {
	case <-done:
		return fmt.Errorf("did not exit within %v of SIGTERM, nor after SIGQUIT; killed", StopTimeout)
	case <-time.After(StopTimeout):
		return errors.New("did not exit even after SIGKILL")
	}
}

// Kill sends SIGKILL (no chance to clean up) and waits for the exit.
func (p *Process) Kill() error {
	done := p.doneChan()
	p.mu.Lock()
	proc := p.cmd.Process
	p.mu.Unlock()
	_ = proc.Kill()
	select {
	case <-done:
		return nil
	case <-time.After(StopTimeout):
		return fmt.Errorf("%s did not exit after SIGKILL", p.Name)
	}
}

// Log returns the whole log so far.
func (p *Process) Log() string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", p.LogPath, err)
	}
	return string(b)
}

// Tail returns the last n lines of the log.
func (p *Process) Tail(n int) string {
	b := []byte(p.Log())
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
