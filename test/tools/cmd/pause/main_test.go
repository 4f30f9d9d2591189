package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMain runs main instead of the tests when the test binary is the
// pause process a test started (PAUSE_TEST_CHILD=1).
func TestMain(m *testing.M) {
	if os.Getenv("PAUSE_TEST_CHILD") == "1" {
		if os.Getenv("PAUSE_TEST_ZOMBIE") == "1" {
			// A child that exits at once: pause must reap it.
			if err := exec.Command("true").Start(); err != nil {
				os.Exit(3)
			}
		}
		main()
		return
	}
	os.Exit(m.Run())
}

// startPause runs main in a child process and waits until it prints its
// warning (it is not PID 1), so its signal handlers are installed.
func startPause(t *testing.T, zombie bool) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "PAUSE_TEST_CHILD=1")
	if zombie {
		cmd.Env = append(cmd.Env, "PAUSE_TEST_ZOMBIE=1")
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	time.Sleep(500 * time.Millisecond)
	return cmd, &stderr
}

// TestPauseExitsOnSignal: SIGTERM and SIGINT end pause with status 0, and
// it keeps running until then.
func TestPauseExitsOnSignal(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			cmd, stderr := startPause(t, false)
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				t.Fatalf("pause exited before a signal: %v (%s)", err, stderr)
			case <-time.After(300 * time.Millisecond):
			}
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("pause exited with %v after %v, want status 0 (%s)", err, sig, stderr)
				}
				if !strings.Contains(stderr.String(), "Shutting down") {
					t.Errorf("stderr %q lacks the shutdown message", stderr)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("pause still runs 10s after %v", sig)
			}
		})
	}
}

// TestPauseReapsChildren: an exited child of pause does not stay a zombie.
func TestPauseReapsChildren(t *testing.T) {
	cmd, stderr := startPause(t, true)
	deadline := time.Now().Add(10 * time.Second)
	for {
		zombies, err := zombieChildren(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if zombies == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pause left %d zombie children (%s)", zombies, stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("pause exited with %v (%s)", ee, stderr)
		}
		t.Fatal(err)
	}
}

// zombieChildren counts the children of pid in state Z, from /proc.
func zombieChildren(pid int) (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range entries {
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so cut at the last ')'.
		s := string(stat)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) >= 2 && f[0] == "Z" && f[1] == strconv.Itoa(pid) {
			n++
		}
	}
	return n, nil
}
