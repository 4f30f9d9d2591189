//go:build unix

package file

// Fixtures as in state_test.go: services in namespace demo with cluster
// IPs in 198.19.0.0/16, endpoints in 198.18.0.0/16.

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/internal/metrics"
)

// problems records what the source gives Options.OnProblem.
type problems struct {
	mu  sync.Mutex
	got []string
}

func (p *problems) add(s string) {
	p.mu.Lock()
	p.got = append(p.got, s)
	p.mu.Unlock()
}

func (p *problems) last() (string, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.got) == 0 {
		return "", 0
	}
	return p.got[len(p.got)-1], len(p.got)
}

// waitProblem waits (bounded) until a read after the first `after` ones
// reported a problem that contains want ("" waits for a good read).
func (p *problems) wait(t *testing.T, after int, want string) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		last, n := p.last()
		if n > after && (want == "" && last == "" || want != "" && strings.Contains(last, want)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for problem %q; last reported %q", want, last)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// runWatched starts a source on path that reports its problems.
func runWatched(t *testing.T, path string, limit int64) (*recorder, *problems) {
	t.Helper()
	rec, pr := &recorder{}, &problems{}
	src := &fileSource{path: path, poll: 50 * time.Millisecond, debounce: fast, limit: limit, opts: Options{OnProblem: pr.add}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, rec) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v after cancel", err)
			}
		case <-time.After(waitFor):
			t.Errorf("Run did not return after cancel (blocked on a read?)")
		}
	})
	return rec, pr
}

// dumpList is a snapshot as `kubectl get -o yaml` writes it: one List
// whose kind comes after its items.
func dumpList(t *testing.T, rv string) string {
	t.Helper()
	var items []any
	for _, d := range []string{svcDoc("web", rv, 80), sliceDoc("web-1", "web", rv), svcDoc("api", rv, 80), sliceDoc("api-1", "api", rv), nodeDoc("node-a", rv)} {
		var o map[string]any
		if err := yaml.Unmarshal([]byte(d), &o); err != nil {
			t.Fatal(err)
		}
		items = append(items, o)
	}
	b, err := yaml.Marshal(map[string]any{"apiVersion": "v1", "items": items, "kind": "List", "metadata": map[string]any{"resourceVersion": ""}})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// firstUpdates is what the source gives at start for dumpList: in file
// order.
var firstUpdates = []string{
	"update Node node-a rv=1", "update Service demo/web rv=1", "update Service demo/api rv=1",
	"update EndpointSlice demo/web-1 rv=1", "update EndpointSlice demo/api-1 rv=1", "synced",
}

// allUpdates is what a reread gives when every object of dumpList changed:
// sorted by kind and key.
var allUpdates = func(rv string) []string {
	return []string{
		"update Node node-a rv=" + rv, "update Service demo/api rv=" + rv, "update Service demo/web rv=" + rv,
		"update EndpointSlice demo/api-1 rv=" + rv, "update EndpointSlice demo/web-1 rv=" + rv,
	}
}

// TestFileFaults breaks the snapshot in each way a file can be broken and
// checks that no deletion (no event at all) reaches the handler, that the
// fault is counted under its reason and reported as a problem, and that a
// good file written afterwards applies at once.
func TestFileFaults(t *testing.T) {
	const limit = 64 << 10
	for _, tc := range []struct {
		name string
		// dir: the source reads the directory, not the file.
		dir bool
		// breakIt breaks the snapshot file at path.
		breakIt func(t *testing.T, path string)
		// reasons the fault may be counted under; the first is also
		// looked for in the reported problem.
		reasons []string
		// dropDAC: the reader must not have CAP_DAC_OVERRIDE and
		// CAP_DAC_READ_SEARCH (see runWithoutDACOverride).
		dropDAC bool
	}{{
		name:    "missing",
		breakIt: func(t *testing.T, path string) { remove(t, path) },
		reasons: []string{ReasonMissing},
	}, {
		name:    "directory emptied",
		dir:     true,
		breakIt: func(t *testing.T, path string) { remove(t, path) },
		reasons: []string{ReasonNoFiles},
	}, {
		name:    "empty",
		breakIt: func(t *testing.T, path string) { writeFile(t, path, "") },
		reasons: []string{ReasonEmpty},
	}, {
		name:    "empty in a directory",
		dir:     true,
		breakIt: func(t *testing.T, path string) { writeFile(t, path, "") },
		reasons: []string{ReasonEmpty},
	}, {
		name:    "garbage",
		breakIt: func(t *testing.T, path string) { writeFile(t, path, "\x00\x01\x02 garbage: [ {\n\x7f") },
		reasons: []string{ReasonUnparsable},
	}, {
		name:    "plain text",
		dir:     true,
		breakIt: func(t *testing.T, path string) { writeFile(t, path, "this is not a snapshot\n") },
		reasons: []string{ReasonUnparsable},
	}, {
		name: "60 % of the YAML",
		breakIt: func(t *testing.T, path string) {
			full := dumpList(t, "1")
			writeFile(t, path, full[:len(full)*6/10])
		},
		reasons: []string{ReasonTruncated, ReasonUnparsable},
	}, {
		name: "60 % of the YAML in a directory",
		dir:  true,
		breakIt: func(t *testing.T, path string) {
			full := dumpList(t, "1")
			writeFile(t, path, full[:len(full)*6/10])
		},
		reasons: []string{ReasonTruncated, ReasonUnparsable},
	}, {
		name: "directory in place",
		breakIt: func(t *testing.T, path string) {
			remove(t, path)
			if err := os.Mkdir(path, 0o755); err != nil {
				t.Fatal(err)
			}
		},
		reasons: []string{ReasonNotRegular},
	}, {
		name: "directory in place in a directory",
		dir:  true,
		breakIt: func(t *testing.T, path string) {
			remove(t, path)
			if err := os.Mkdir(path, 0o755); err != nil {
				t.Fatal(err)
			}
		},
		reasons: []string{ReasonNotRegular},
	}, {
		name:    "FIFO in place",
		breakIt: func(t *testing.T, path string) { mkfifo(t, path) },
		reasons: []string{ReasonNotRegular},
	}, {
		name:    "FIFO in place in a directory",
		dir:     true,
		breakIt: func(t *testing.T, path string) { mkfifo(t, path) },
		reasons: []string{ReasonNotRegular},
	}, {
		name: "oversize",
		breakIt: func(t *testing.T, path string) {
			writeFile(t, path, dumpList(t, "2")+strings.Repeat("# padding\n", limit/10))
		},
		reasons: []string{ReasonTooLarge},
	}, {
		// Mode 000. Root reads it anyway (CAP_DAC_OVERRIDE), so as root
		// the case runs in a child without that capability (dropDAC).
		name:    "unreadable",
		dropDAC: true,
		breakIt: func(t *testing.T, path string) {
			if err := os.Chmod(path, 0); err != nil {
				t.Fatal(err)
			}
		},
		reasons: []string{ReasonUnreadable},
	}, {
		// A file whose read() fails whoever reads it, as on a failing
		// disk or a dead NFS server: the snapshot path becomes a symlink
		// (followed, as ConfigMap volumes need) to /proc/self/mem, a
		// regular file (mode 0600, size 0) that opens and then reads
		// with EIO, since nothing is mapped at offset 0 of the reader.
		name: "read error",
		breakIt: func(t *testing.T, path string) {
			tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".lnk")
			if err := os.Symlink("/proc/self/mem", tmp); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, path); err != nil {
				t.Fatal(err)
			}
		},
		reasons: []string{ReasonUnreadable},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.dropDAC {
				if os.Geteuid() == 0 && os.Getenv(envNoDACOverride) != "1" {
					runWithoutDACOverride(t)
					return
				}
				requireNoDACOverride(t)
			}
			dir := t.TempDir()
			path := filepath.Join(dir, "state.yaml")
			writeFile(t, path, dumpList(t, "1"))
			watched := path
			if tc.dir {
				watched = dir
			}
			rec, pr := runWatched(t, watched, limit)
			n := rec.expect(t, 0, 0, firstUpdates...)
			pr.wait(t, 0, "")
			before := map[string]float64{}
			for _, r := range Reasons {
				before[r] = testutil.ToFloat64(metrics.SourceFileErrorsTotal.WithLabelValues(r))
			}
			_, reads := pr.last()

			tc.breakIt(t, path)
			pr.wait(t, reads, tc.reasons[0])
			// Nothing is delivered, however long it stays broken
			// (several poll intervals).
			n = rec.expect(t, n, quiet)
			var counted []string
			for _, r := range Reasons {
				if testutil.ToFloat64(metrics.SourceFileErrorsTotal.WithLabelValues(r)) > before[r] {
					counted = append(counted, r)
				}
			}
			if len(counted) != 1 || !slices.Contains(tc.reasons, counted[0]) {
				t.Errorf("faults counted under %v, want one of %v", counted, tc.reasons)
			}

			// A good file, written as it should be (rename over
			// whatever is there now), applies promptly.
			if st, err := os.Lstat(path); err == nil && (st.IsDir() || st.Mode()&os.ModeSymlink != 0) {
				remove(t, path)
			}
			if err := os.Chmod(path, 0o644); err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			replaceFile(t, path, dumpList(t, "3"))
			pr.wait(t, reads, "")
			rec.expect(t, n, quiet, allUpdates("3")...)
		})
	}
}

// TestFileFaultsDirectory: in directory mode, a broken file keeps its own
// objects while the other files' changes apply, and removing one file of
// several removes its objects (that is how an operator deletes them).
func TestFileFaultsDirectory(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	writeFile(t, a, svcDoc("web", "1", 80))
	writeFile(t, b, svcDoc("api", "1", 80))
	rec, pr := runWatched(t, dir, maxFileSize)
	n := rec.expect(t, 0, 0, "update Service demo/web rv=1", "update Service demo/api rv=1", "synced")
	_, reads := pr.last()

	mkfifo(t, a)
	pr.wait(t, reads, ReasonNotRegular)
	n = rec.expect(t, n, quiet)
	_, reads = pr.last()

	// The other file still applies; the FIFO keeps web.
	replaceFile(t, b, svcDoc("api", "2", 80))
	n = rec.expect(t, n, quiet, "update Service demo/api rv=2")
	if p, _ := pr.last(); !strings.Contains(p, ReasonNotRegular) {
		t.Errorf("problem after the other file changed: %q, want the FIFO still named", p)
	}

	replaceFile(t, a, svcDoc("web", "1", 80))
	pr.wait(t, reads, "")
	n = rec.expect(t, n, quiet)

	remove(t, b)
	rec.expect(t, n, quiet, "delete Service demo/api")
}

// TestFileFaultAtStart: a file that is broken when the source starts gives
// nothing, is reported, and applies once it is good.
func TestFileFaultAtStart(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.yaml")
	writeFile(t, path, "garbage")
	rec, pr := runWatched(t, dir, maxFileSize)
	n := rec.expect(t, 0, 0, "synced")
	pr.wait(t, 0, ReasonUnparsable)
	_, reads := pr.last()
	replaceFile(t, path, dumpList(t, "1"))
	pr.wait(t, reads, "")
	rec.expect(t, n, quiet, allUpdates("1")...)
}

func TestRunRefusesFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.yaml")
	mkfifo(t, path)
	done := make(chan error, 1)
	go func() { done <- New(path, Options{}).Run(context.Background(), &recorder{}) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "FIFO") {
			t.Errorf("Run on a FIFO: %v, want an error that says FIFO", err)
		}
	case <-time.After(waitFor):
		t.Fatal("Run on a FIFO blocked")
	}
}

// envNoDACOverride is set in the child runWithoutDACOverride starts.
const envNoDACOverride = "KPROXY_TEST_NO_DAC_OVERRIDE"

// runWithoutDACOverride runs t (a subtest of this binary) again in a child
// process that is root without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH
// (setpriv drops them from the bounding set, so the exec'd child never has
// them), as kproxy in a container that drops them: permission bits then
// apply to it as to any user. It fails t if the child fails or does not run
// the subtest.
func runWithoutDACOverride(t *testing.T) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var pattern []string
	for _, part := range strings.Split(t.Name(), "/") {
		pattern = append(pattern, "^"+regexp.QuoteMeta(part)+"$")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "setpriv", "--bounding-set=-dac_override,-dac_read_search", "--",
		exe, "-test.run", strings.Join(pattern, "/"), "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), envNoDACOverride+"=1")
	out, err := cmd.CombinedOutput()
	t.Logf("as root without CAP_DAC_OVERRIDE (setpriv):\n%s", out)
	if err != nil {
		t.Fatalf("the child failed: %v", err)
	}
	if !strings.Contains(string(out), "--- PASS: "+t.Name()+" ") {
		t.Fatalf("the child did not pass %s", t.Name())
	}
}

// requireNoDACOverride fails unless permission bits apply to this process.
func requireNoDACOverride(t *testing.T) {
	t.Helper()
	probe := filepath.Join(t.TempDir(), "mode-000")
	if err := os.WriteFile(probe, []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	if f, err := os.Open(probe); err == nil {
		f.Close()
		t.Fatalf("this process reads a mode 000 file (uid %d): it has CAP_DAC_OVERRIDE", os.Geteuid())
	}
}

func remove(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
}

func mkfifo(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Fatal(err)
	}
}
