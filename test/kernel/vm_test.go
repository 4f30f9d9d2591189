package kernel

import (
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/testutil/netns"
	"github.com/kproxy/kproxy/internal/testutil/vm"
)

// vmTests are the kernel tests that need what some hosts lack; each says
// why the host cannot run it (nil: it can). On such a host TestInVM runs
// them all inside one test VM (internal/testutil/vm, Debian's kernel), and
// each skips on the host itself, pointing at TestInVM. One boot for all of
// them: an emulated VM (no KVM here) takes seconds to boot and runs
// several times slower than the host.
var vmTests = []struct {
	name      string
	hostLacks func(t *testing.T) error
}{
	{"TestSCTP", sctpUnsupported},
	{"TestMemoryPressure", func(*testing.T) error { return memoryCgroupUnsupported() }},
}

// TestInVM runs the vmTests the host cannot run inside one test VM, with
// the same kproxy binary (KPROXY_VM_ONLY=REGEXP: only those it matches). Without a VM it skips, saying why, unless
// KPROXY_VM=1 (CI), where it fails.
//
// The VM run happens before t.Parallel, while the package's parallel tests
// still wait: an emulated VM is slow enough without sharing the CPUs with
// them, and the inner tests keep the usual timeouts.
func TestInVM(t *testing.T) {
	requireKernel(t)
	if vm.InVM() {
		t.Fatal("TestInVM runs on the host; inside the VM the tests it names run themselves")
	}
	var only *regexp.Regexp
	if v := os.Getenv("KPROXY_VM_ONLY"); v != "" {
		only = regexp.MustCompile(v)
	}
	var names, whys []string
	for _, vt := range vmTests {
		if only != nil && !only.MatchString(vt.name) {
			continue
		}
		if err := vt.hostLacks(t); err != nil {
			names = append(names, vt.name)
			whys = append(whys, vt.name+": "+err.Error())
		}
	}
	if len(names) == 0 {
		t.Skip("the host runs every test of vmTests itself")
	}
	ok, why := vm.Available()
	switch {
	case !ok && vm.Required():
		t.Fatalf("not tested: %s; and no test VM: %s (KPROXY_VM=1 requires one)", strings.Join(whys, "; "), why)
	case !ok:
		t.Skipf("not tested: %s; and no test VM: %s", strings.Join(whys, "; "), why)
	}
	t.Logf("running in the test VM: %s", strings.Join(whys, "; "))
	defer func(m []string) { vm.DefaultModules = m }(vm.DefaultModules)
	vm.DefaultModules = append(slices.Clone(vm.DefaultModules), iptablesModules...)
	// Emulated, TestMemoryPressure took 5.3 minutes and TestSCTP 3.2,
	// 9.2 with the boot (of the 10 minutes vm.DefaultTimeout allows);
	// the test's own deadline (-timeout) still bounds the run.
	defer func(d time.Duration) { vm.TestTimeout = d }(vm.TestTimeout)
	vm.TestTimeout = 25 * time.Minute
	vm.RunTestInVM(t, "^("+strings.Join(names, "|")+")$", "KPROXY_KERNEL_TEST_BIN="+kproxyBin)
}

// skipForVM skips a vmTests test on a host that lacks what it needs (err),
// or fails it inside the VM, whose kernel must have it.
func skipForVM(t *testing.T, err error) {
	t.Helper()
	if vm.InVM() {
		t.Fatalf("the test VM cannot run this test: %v", err)
	}
	t.Skipf("not on this host (%v): TestInVM runs it inside the test VM", err)
}

// sctpUnsupported says why the kernel cannot open SCTP sockets (it lacks
// CONFIG_IP_SCTP), or nil.
func sctpUnsupported(t *testing.T) error {
	err := netns.New(t, netns.RandomID(3), "sctp-probe").SCTPSupported()
	if err != nil && !errors.Is(err, netns.ErrSCTPUnsupported) {
		t.Fatal(err)
	}
	return err
}
