package vm

// Boot tests: each boots the prepared kernel under qemu (KVM when usable,
// else TCG, 10-20 s a boot). They skip without a VM, and fail instead when
// KPROXY_VM=1 (CI). Host paths: a directory made in the host's /tmp stands
// for a test binary's build directory, which the guest's fresh /tmp hides
// unless it is bound.

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// requireVM skips unless a VM can be started here (fails with KPROXY_VM=1).
func requireVM(t *testing.T) {
	t.Helper()
	if InVM() {
		t.Skip("already inside the test VM")
	}
	if ok, why := Available(); !ok {
		if Required() {
			t.Fatalf("no test VM: %s (KPROXY_VM=1 requires one; run test/vm/prepare.sh)", why)
		}
		t.Skipf("no test VM: %s (test/vm/prepare.sh makes one)", why)
	}
}

// hostTmpDir makes a directory in the host's /tmp (not $TMPDIR: the test is
// about what the guest's /tmp hides).
func hostTmpDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "kproxy-vm-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// TestRun boots one VM whose command runs every check below in turn, each
// after a "## <index>" line, and ends with output lacking a final newline
// and exit code 7: the console carries output and exit code back intact.
func TestRun(t *testing.T) {
	requireVM(t)
	k, err := FindKernel()
	if err != nil {
		t.Fatal(err)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	dir := hostTmpDir(t)
	bound, unbound := dir+"/bound", dir+"/unbound"
	for _, f := range []string{bound, unbound} {
		if err := os.WriteFile(f, []byte("content of "+f+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	checks := []struct{ name, script, want string }{
		{"the guest kernel", "uname -r", k.Release},
		{"hostname", "cat /proc/sys/kernel/hostname", "kproxy-vm"},
		{"environment", "echo $KPROXY_VM_CHECK", "hello"},
		{"working directory", "pwd", wd},
		{"stderr goes to the output", "echo to-stderr >&2", "to-stderr"},
		{"a bound host file under /tmp", "cat " + bound, "content of " + bound},
		{"the rest of the host's /tmp is hidden", "test -e " + unbound + " && echo visible || echo hidden", "hidden"},
		{"/tmp is writable", "echo w > /tmp/w && cat /tmp/w", "w"},
		{"the host's root is read-only", "touch /kproxy-vm-test 2>/dev/null && echo writable || echo read-only", "read-only"},
		{"Config.Modules are loaded", "test -d /sys/module/sctp && echo loaded", "loaded"},
		{"the kernel autoloads modules", "ip link add d0 type dummy && test -d /sys/module/dummy && echo loaded", "loaded"},
		{"lo is up", "cat /sys/class/net/lo/flags", "0x9"}, // IFF_UP|IFF_LOOPBACK
	}
	var script strings.Builder
	for i, c := range checks {
		fmt.Fprintf(&script, "echo '## %d'\n%s\n", i, c.script)
	}
	fmt.Fprintf(&script, "echo '## %d'\nprintf 'no newline'\nexit 7\n", len(checks))

	var out []string
	res, err := Run(context.Background(), Config{
		Argv:    []string{"/bin/sh", "-c", script.String()},
		Env:     []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "KPROXY_VM_CHECK=hello"},
		Dir:     wd,
		Binds:   []string{bound},
		Modules: []string{"sctp"},
		Output:  func(l string) { out = append(out, l) },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: booted in %v, %v in all", res.Accel, res.Boot, res.Total)
	if res.ExitCode != 7 {
		t.Errorf("exit code %d, want 7", res.ExitCode)
	}
	sections := map[int][]string{}
	cur := -1
	for _, l := range out {
		var i int
		if _, err := fmt.Sscanf(l, "## %d", &i); err == nil {
			cur = i
			continue
		}
		sections[cur] = append(sections[cur], l)
	}
	for i, c := range checks {
		if got := strings.Join(sections[i], "\n"); got != c.want {
			t.Errorf("%s: %q printed %q, want %q", c.name, c.script, got, c.want)
		}
	}
	if got := sections[len(checks)]; len(got) != 1 || got[0] != "no newline" {
		t.Errorf("output without a final newline: got %q, want %q", got, "no newline")
	}
	if got := sections[-1]; len(got) != 0 {
		t.Errorf("output before the first check: %q", got)
	}
}

func TestRunBootTimeout(t *testing.T) {
	requireVM(t)
	start := time.Now()
	_, err := Run(context.Background(), Config{Argv: []string{"true"}, BootTimeout: time.Second})
	if err == nil || !strings.Contains(err.Error(), "did not start the command within 1s") {
		t.Fatalf("Run = %v, want a boot timeout", err)
	}
	// qemu is killed, not waited for.
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("Run took %v after a 1s boot timeout", took)
	}
}

// TestRunTestInVM runs itself in the VM, where it checks what the guest
// gives a test (insideVM): once passing, once failing on purpose. (One
// test for both sides, so that the host's run has no test that always
// skips.)
func TestRunTestInVM(t *testing.T) {
	if InVM() {
		insideVM(t)
		return
	}
	requireVM(t)
	f := hostTmpDir(t) + "/file"
	if err := os.WriteFile(f, []byte("from the host"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := runTest(t, "^TestRunTestInVM$", []string{"KPROXY_VM_TEST_FILE=" + f})
	if err != nil || got != outcomePassed {
		t.Fatalf("passing inner test: outcome %v, error %v", got, err)
	}
	_, err = runTest(t, "^TestRunTestInVM$", []string{"KPROXY_VM_TEST_FAIL=1"})
	if err == nil || !strings.Contains(err.Error(), `the tests matching "^TestRunTestInVM$" failed inside the VM (exit code 1)`) {
		t.Fatalf("failing inner test: error %v, want the failure reported", err)
	}
}

// insideVM is TestRunTestInVM's side in the VM.
func insideVM(t *testing.T) {
	if os.Getenv("KPROXY_VM_TEST_FAIL") == "1" {
		t.Fatal("failing on purpose")
	}
	host, err := os.Hostname()
	if err != nil || host != "kproxy-vm" {
		t.Errorf("hostname %q, %v; want kproxy-vm", host, err)
	}
	if os.Getuid() != 0 {
		t.Errorf("uid %d, want root", os.Getuid())
	}
	// An env value naming a host file under /tmp is bound into the guest.
	b, err := os.ReadFile(os.Getenv("KPROXY_VM_TEST_FILE"))
	if err != nil || string(b) != "from the host" {
		t.Errorf("KPROXY_VM_TEST_FILE: %q, %v", b, err)
	}
	if ok, why := Available(); ok || why != "already inside the test VM" {
		t.Errorf("Available() inside the VM = %v, %q", ok, why)
	}
	if err := os.WriteFile(t.TempDir()+"/x", []byte("x"), 0o644); err != nil {
		t.Errorf("t.TempDir is not writable: %v", err)
	}
}
