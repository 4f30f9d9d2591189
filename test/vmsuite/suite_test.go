// Package vmsuite runs, in one boot of the test VM, every test that needs
// the VM's kernel (tests.txt lists them); see internal/testutil/vm's
// RunSuite.
package vmsuite

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kproxy/kproxy/internal/testutil/vm"
)

func TestVMSuite(t *testing.T) {
	if vm.InVM() {
		t.Fatal("the suite runs on the host; it boots the VM itself")
	}
	if ok, why := vm.Available(); !ok {
		if vm.Required() {
			t.Fatalf("no test VM: %s (KPROXY_VM=1 requires one)", why)
		}
		t.Skipf("no test VM: %s (test/vm/prepare.sh makes one)", why)
	}
	if os.Geteuid() != 0 {
		t.Skip("the VM's tests run as root: run as root")
	}
	f, err := os.Open("tests.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	entries, err := vm.ParseSuite(f)
	if err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	vm.RunSuite(t, root, entries)
}
