package vm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// DefaultModules are loaded in every RunTestInVM guest before the test
// starts. br_netfilter is not loaded on demand (it makes bridged pod
// traffic pass the IP hooks; the netns harness sets its sysctls). The rest
// would be: the kernel autoloads them through modprobe, but without KVM an
// autoload costs seconds, and nf_tables replays the whole transaction after
// each module it had to load, so kproxy's first sync took 40 s instead of
// under one. They are what kproxy's nftables rules and the netns harness
// use; anything missing here still loads on demand, only slowly.
var DefaultModules = []string{
	"br_netfilter", "veth", "nf_conntrack_netlink",
	"nft_chain_nat", "nft_ct", "nft_fib_ipv4", "nft_fib_ipv6", "nft_masq", "nft_nat",
	"nft_numgen", "nft_reject_ipv4", "nft_reject_ipv6",
}

// TestTimeout bounds a RunTestInVM run (also by the test's deadline). A
// gate test that runs a package's slow VM tests in one boot may raise it
// for its run (and put it back).
var TestTimeout = DefaultTimeout

// innerTimeoutMargin is left between the inner test binary's -test.timeout
// and the VM's timeout, so the inner binary reports its own timeout
// (with stacks) before the VM is killed.
const innerTimeoutMargin = 30 * time.Second

// RunTestInVM runs the tests matching pattern of the current test binary
// again, inside a fresh VM (with KPROXY_IN_VM=1 and env added to the
// environment), streams their -test.v output into t.Log, and fails t if
// they fail. When every inner test skipped, t skips too. The caller checks
// Available first.
//
// What the guest can see: the host's root read-only, fresh /tmp, /run and
// /var/tmp, and, through them, the test binary, the working directory, and
// every env value that is the absolute path of an existing host file or
// directory (such as a binary built into the host's /tmp).
func RunTestInVM(t testing.TB, pattern string, env ...string) {
	t.Helper()
	outcome, err := runTest(t, pattern, env)
	if err != nil {
		t.Fatal(err)
	}
	if outcome == outcomeSkipped {
		t.Skipf("the tests matching %q skipped inside the VM (see the log)", pattern)
	}
}

type outcome int

const (
	outcomePassed outcome = iota
	outcomeSkipped
)

func runTest(t testing.TB, pattern string, env []string) (outcome, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, err
	}
	wd, err := os.Getwd()
	if err != nil {
		return 0, err
	}
	timeout := TestTimeout
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if dl, ok := d.Deadline(); ok {
			timeout = min(timeout, time.Until(dl)-5*time.Second)
		}
	}
	if timeout < 2*innerTimeoutMargin {
		return 0, fmt.Errorf("only %v left for a VM run", timeout)
	}
	guestEnv := testEnv(os.Environ(), env)
	cfg := Config{
		Argv: []string{exe, "-test.run", pattern, "-test.v", "-test.count=1",
			"-test.timeout", (timeout - innerTimeoutMargin).String()},
		Env:     guestEnv,
		Dir:     wd,
		Binds:   append([]string{exe, wd}, pathValues(env)...),
		Modules: DefaultModules,
		Timeout: timeout,
	}
	var results testResults
	cfg.Output = func(line string) {
		results.add(line)
		t.Log(line)
	}
	res, err := Run(context.Background(), cfg)
	if err != nil {
		return 0, err
	}
	t.Logf("VM (%s): booted in %v, ran for %v", res.Accel, res.Boot.Round(time.Millisecond), res.Total.Round(time.Millisecond))
	switch {
	case res.ExitCode != 0:
		return 0, fmt.Errorf("the tests matching %q failed inside the VM (exit code %d)", pattern, res.ExitCode)
	case results.ran == 0:
		return 0, fmt.Errorf("no test matching %q ran inside the VM", pattern)
	case results.passed == 0 && results.skipped > 0:
		return outcomeSkipped, nil
	}
	return outcomePassed, nil
}

// testEnv is the inner test's environment: the host's PATH, HOME and
// KPROXY_* variables (TMPDIR and the like would point at what the guest
// does not have), then extra, then KPROXY_IN_VM=1.
func testEnv(host, extra []string) []string {
	var env []string
	for _, kv := range host {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case k == EnvInVM:
		case k == "PATH", k == "HOME", strings.HasPrefix(k, "KPROXY_"):
			env = append(env, kv)
		}
	}
	env = append(env, extra...)
	return append(env, EnvInVM+"=1")
}

// pathValues are the values of env that are absolute paths of existing
// host files or directories.
func pathValues(env []string) []string {
	var ps []string
	for _, kv := range env {
		_, v, _ := strings.Cut(kv, "=")
		if !filepath.IsAbs(v) {
			continue
		}
		if _, err := os.Stat(v); err == nil {
			ps = append(ps, v)
		}
	}
	return ps
}

// testResults counts the top-level results of a -test.v output.
type testResults struct {
	ran, passed, skipped, failed int
}

func (r *testResults) add(line string) {
	// Subtests' results are indented; only top-level ones count.
	switch {
	case strings.HasPrefix(line, "=== RUN "):
		if !strings.Contains(line, "/") {
			r.ran++
		}
	case strings.HasPrefix(line, "--- PASS: "):
		r.passed++
	case strings.HasPrefix(line, "--- SKIP: "):
		r.skipped++
	case strings.HasPrefix(line, "--- FAIL: "):
		r.failed++
	}
}
