package vm

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The suite: every test that needs the VM's kernel, from every package,
// run in one boot. The host's test groups leave those tests out
// (hack/test.sh passes -skip with their names); the VM group runs
// test/vmsuite, which builds each package's test binary and runs the
// listed tests of all of them, one after the other, in a single VM. A
// test run by itself on a host that lacks the feature still re-runs
// itself in a VM of its own (RunTestInVM).

// SuiteEntry is one package's part of the suite.
type SuiteEntry struct {
	// Pkg is the package directory relative to the module root
	// ("./test/kernel").
	Pkg string
	// Tests are top-level test names, run with -test.run ^(a|b)$.
	Tests []string
	// Gates are left out of the host's runs but not run in the VM: a
	// package's own gate that would boot a VM for its tests, an opt-in
	// measurement that skips without its variable.
	Gates []string
	// Modules are loaded before the tests (on-demand loads are slow in
	// the VM).
	Modules []string
	// Env is added to the package's environment (K=V); the value
	// "$KPROXY" is replaced by the path of a kproxy binary the suite
	// builds from the checkout.
	Env []string
}

// ParseSuite reads the suite's list: one line per package, "#" comments,
//
//	./pkg  TestA TestB  [modules=m1,m2]  [env=K=V]...  [gate=TestG,...]
//
// A line with gates only names tests that boot a VM of their own and are
// not run in the suite (measurements run by hand).
func ParseSuite(r io.Reader) ([]SuiteEntry, error) {
	var entries []SuiteEntry
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		e := SuiteEntry{Pkg: f[0]}
		if !strings.HasPrefix(e.Pkg, "./") {
			return nil, fmt.Errorf("line %d: package %q is not a ./ path", n, e.Pkg)
		}
		for _, w := range f[1:] {
			switch {
			case strings.HasPrefix(w, "modules="):
				e.Modules = append(e.Modules, strings.Split(strings.TrimPrefix(w, "modules="), ",")...)
			case strings.HasPrefix(w, "gate="):
				e.Gates = append(e.Gates, strings.Split(strings.TrimPrefix(w, "gate="), ",")...)
			case strings.HasPrefix(w, "env="):
				kv := strings.TrimPrefix(w, "env=")
				if !strings.Contains(kv, "=") {
					return nil, fmt.Errorf("line %d: env %q is not K=V", n, kv)
				}
				e.Env = append(e.Env, kv)
			case strings.HasPrefix(w, "Test"):
				e.Tests = append(e.Tests, w)
			default:
				return nil, fmt.Errorf("line %d: %q is not a test name, modules= or env=", n, w)
			}
		}
		if len(e.Tests) == 0 && len(e.Gates) == 0 {
			return nil, fmt.Errorf("line %d: no test for %s", n, e.Pkg)
		}
		entries = append(entries, e)
	}
	return entries, sc.Err()
}

// SuiteSkip is the -skip pattern that leaves the suite's tests out of a
// host run.
func SuiteSkip(entries []SuiteEntry) string {
	var names []string
	for _, e := range entries {
		names = append(names, e.Tests...)
		names = append(names, e.Gates...)
	}
	return "^(" + strings.Join(names, "|") + ")$"
}

// suiteMarker starts the lines the suite's script prints between packages.
const suiteMarker = "@@kproxy-vmsuite"

// suiteScript runs each package's binary in its directory and prints
// "@@kproxy-vmsuite <i> exit <code>" after each.
func suiteScript(root string, entries []SuiteEntry, bins []string, kproxy string, timeout time.Duration) string {
	var b strings.Builder
	for i, e := range entries {
		fmt.Fprintf(&b, "echo '%s %d start'\n", suiteMarker, i)
		fmt.Fprintf(&b, "cd %s\n", shellQuote(filepath.Join(root, e.Pkg)))
		b.WriteString("env")
		for _, kv := range e.Env {
			b.WriteString(" " + shellQuote(strings.ReplaceAll(kv, "$KPROXY", kproxy)))
		}
		fmt.Fprintf(&b, " %s -test.run %s -test.v -test.count=1 -test.timeout %s 2>&1\n",
			shellQuote(bins[i]), shellQuote("^("+strings.Join(e.Tests, "|")+")$"), timeout)
		fmt.Fprintf(&b, "echo \"%s %d exit $?\"\n", suiteMarker, i)
	}
	return b.String()
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// suiteSection is what one package printed in the VM.
type suiteSection struct {
	lines   []string
	exit    int
	ended   bool
	results testResults
	// top-level outcomes by test name
	outcome map[string]string
}

// splitSuite sorts the VM's output into the packages' sections.
func splitSuite(lines []string, n int) []*suiteSection {
	secs := make([]*suiteSection, n)
	for i := range secs {
		secs[i] = &suiteSection{outcome: map[string]string{}}
	}
	cur := -1
	for _, l := range lines {
		if rest, ok := strings.CutPrefix(l, suiteMarker+" "); ok {
			f := strings.Fields(rest)
			i, err := strconv.Atoi(f[0])
			if err != nil || i < 0 || i >= n || len(f) < 2 {
				continue
			}
			switch f[1] {
			case "start":
				cur = i
			case "exit":
				if len(f) == 3 {
					secs[i].exit, _ = strconv.Atoi(f[2])
					secs[i].ended = true
				}
				cur = -1
			}
			continue
		}
		if cur < 0 {
			continue
		}
		s := secs[cur]
		s.lines = append(s.lines, l)
		s.results.add(l)
		for _, kind := range []string{"PASS", "FAIL", "SKIP"} {
			if name, ok := strings.CutPrefix(l, "--- "+kind+": "); ok {
				name, _, _ = strings.Cut(name, " ")
				s.outcome[name] = kind
			}
		}
	}
	return secs
}

// RunSuite builds the test binaries of entries (and a kproxy binary for
// "$KPROXY" in their env) from the module at root, runs them all in one
// VM, and reports each listed test as a subtest of t: passed when it
// passed inside the VM; a skip inside the VM is a failure (the VM is
// there so that nothing skips).
func RunSuite(t *testing.T, root string, entries []SuiteEntry) {
	t.Helper()
	entries = slices.DeleteFunc(slices.Clone(entries), func(e SuiteEntry) bool { return len(e.Tests) == 0 })
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("kproxy-vmsuite-%d", os.Getpid()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	build := func(args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	start := time.Now()
	kproxy := filepath.Join(dir, "kproxy")
	build("build", "-o", kproxy, "./cmd/kproxy")
	var bins []string
	modules := slices.Clone(DefaultModules)
	for i, e := range entries {
		bin := filepath.Join(dir, fmt.Sprintf("%d-%s.test", i, filepath.Base(e.Pkg)))
		build("test", "-c", "-o", bin, e.Pkg)
		bins = append(bins, bin)
		for _, m := range e.Modules {
			if !slices.Contains(modules, m) {
				modules = append(modules, m)
			}
		}
	}
	t.Logf("built %d test binaries and kproxy in %v", len(bins), time.Since(start).Round(time.Second))

	// Every VM test of the suite in one run: far longer than one test.
	timeout := 40 * time.Minute
	if dl, ok := t.Deadline(); ok {
		timeout = min(timeout, time.Until(dl)-5*time.Second)
	}
	if timeout < 2*innerTimeoutMargin {
		t.Fatalf("only %v left for the VM run", timeout)
	}
	var out []string
	res, err := Run(context.Background(), Config{
		Argv:    []string{"/bin/sh", "-c", suiteScript(root, entries, bins, kproxy, timeout-innerTimeoutMargin)},
		Env:     testEnv(os.Environ(), nil),
		Dir:     root,
		Binds:   []string{dir},
		Modules: modules,
		Timeout: timeout,
		Output:  func(l string) { out = append(out, l) },
	})
	if err != nil {
		t.Logf("VM output:\n%s", strings.Join(out, "\n"))
		t.Fatal(err)
	}
	t.Logf("one VM (%s) for %d packages: booted in %v, ran for %v", res.Accel, len(entries),
		res.Boot.Round(time.Millisecond), res.Total.Round(time.Millisecond))
	secs := splitSuite(out, len(entries))
	for i, e := range entries {
		s := secs[i]
		for _, name := range e.Tests {
			t.Run(strings.TrimPrefix(e.Pkg, "./")+"/"+name, func(t *testing.T) {
				for _, l := range s.lines {
					t.Log(l)
				}
				switch {
				case !s.ended:
					t.Fatalf("the VM stopped before %s's tests ended", e.Pkg)
				case s.outcome[name] == "":
					t.Fatalf("%s did not run inside the VM (exit code %d)", name, s.exit)
				case s.outcome[name] == "SKIP":
					t.Fatalf("%s skipped inside the VM, which is there so that it does not", name)
				case s.outcome[name] == "FAIL":
					t.Fatalf("%s failed inside the VM", name)
				}
			})
		}
		if s.ended && s.exit != 0 && s.results.failed == 0 {
			t.Errorf("%s: exit code %d inside the VM with no test failed", e.Pkg, s.exit)
		}
	}
}
