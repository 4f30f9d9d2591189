// Package vmsuite runs, in one boot of the test VM, every test that needs
// the VM's kernel (tests.txt lists them); see internal/testutil/vm's
// RunSuite.
package vmsuite

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
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

// TestEveryVMTestIsListed: a test that boots a VM of its own
// (vm.RunTestInVM) is in tests.txt, as a test or a gate, so that the
// suite's host runs leave it out and the VM group runs it in the one boot.
func TestEveryVMTestIsListed(t *testing.T) {
	f, err := os.Open("tests.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	entries, err := vm.ParseSuite(f)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, e := range entries {
		for _, n := range append(append([]string{}, e.Tests...), e.Gates...) {
			listed[e.Pkg+" "+n] = true
		}
		if _, err := os.Stat(filepath.Join("../..", e.Pkg)); err != nil {
			t.Errorf("tests.txt names %s: %v", e.Pkg, err)
		}
	}
	testName := regexp.MustCompile(`^(Test\w+)\(t \*testing\.T\)`)
	err = filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "../.." && (d.Name() == "_output" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") || strings.Contains(path, "internal/testutil/vm/") || strings.Contains(path, "test/vmsuite/") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		pkg := "./" + filepath.ToSlash(filepath.Dir(strings.TrimPrefix(path, "../../")))
		// Each top-level function up to the next one.
		for _, fn := range bytes.Split(b, []byte("\nfunc ")) {
			m := testName.FindSubmatch(fn)
			if m != nil && bytes.Contains(fn, []byte("vm.RunTestInVM(")) && !listed[pkg+" "+string(m[1])] {
				t.Errorf("%s: %s boots a VM of its own but is not in tests.txt", pkg, m[1])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
