package file

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networking "k8s.io/api/networking/v1"
)

const waitFor = 10 * time.Second

// recorder is an EventHandler that records calls as "op kind key".
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) add(s string) {
	r.mu.Lock()
	r.events = append(r.events, s)
	r.mu.Unlock()
}

func (r *recorder) ServiceUpdated(s *v1.Service) {
	r.add(fmt.Sprintf("update Service %s/%s rv=%s", s.Namespace, s.Name, s.ResourceVersion))
}
func (r *recorder) ServiceDeleted(s *v1.Service) {
	r.add("delete Service " + s.Namespace + "/" + s.Name)
}
func (r *recorder) EndpointSliceUpdated(s *discovery.EndpointSlice) {
	r.add(fmt.Sprintf("update EndpointSlice %s/%s rv=%s", s.Namespace, s.Name, s.ResourceVersion))
}
func (r *recorder) EndpointSliceDeleted(s *discovery.EndpointSlice) {
	r.add("delete EndpointSlice " + s.Namespace + "/" + s.Name)
}
func (r *recorder) NodeUpdated(n *v1.Node) {
	r.add(fmt.Sprintf("update Node %s rv=%s", n.Name, n.ResourceVersion))
}
func (r *recorder) NodeDeleted(n *v1.Node) { r.add("delete Node " + n.Name) }
func (r *recorder) Synced()                { r.add("synced") }
func (r *recorder) ServiceCIDRsUpdated(all []*networking.ServiceCIDR) {
	r.add(fmt.Sprintf("update ServiceCIDRs (%d)", len(all)))
}

func (r *recorder) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// expect waits until want has arrived after the first `from` events, then
// waits quiet a little longer and checks that nothing else arrived. It
// returns the new number of events seen.
func (r *recorder) expect(t *testing.T, from int, quiet time.Duration, want ...string) int {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for len(r.snapshot()) < from+len(want) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %v; got %v", want, r.snapshot()[from:])
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(quiet)
	got := r.snapshot()[from:]
	if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
	return from + len(got)
}

// doc builds small YAML documents; rv is the resourceVersion.
func svcDoc(name, rv string, port int) string {
	return fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata:\n  name: %s\n  namespace: demo\n  resourceVersion: %q\nspec:\n  clusterIP: 198.19.0.10\n  ports:\n  - port: %d\n", name, rv, port)
}

func sliceDoc(name, svc, rv string) string {
	return fmt.Sprintf("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: %s\n  namespace: demo\n  resourceVersion: %q\n  labels:\n    kubernetes.io/service-name: %s\naddressType: IPv4\nendpoints:\n- addresses: [198.18.129.10]\n", name, rv, svc)
}

func nodeDoc(name, rv string) string {
	return fmt.Sprintf("apiVersion: v1\nkind: Node\nmetadata:\n  name: %s\n  resourceVersion: %q\n", name, rv)
}

func docs(d ...string) string { return strings.Join(d, "---\n") }

// replaceFile writes as editors do: a temporary file renamed over the old.
func replaceFile(t *testing.T, path, data string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// run starts a source with the given timings and stops it at the end of
// the test, checking that Run returns nil.
func run(t *testing.T, path string, poll, debounce time.Duration) *recorder {
	t.Helper()
	rec, _ := runSource(t, path, poll, debounce)
	return rec
}

func runSource(t *testing.T, path string, poll, debounce time.Duration) (*recorder, *fileSource) {
	t.Helper()
	rec := &recorder{}
	src := &fileSource{path: path, poll: poll, debounce: debounce, limit: maxFileSize}
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
			t.Errorf("Run did not return after cancel")
		}
	})
	return rec, src
}

// TestWatchIgnoresOtherFiles: files written next to a watched snapshot (a
// log, an editor's swap file) must not make the source reread it.
func TestWatchIgnoresOtherFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.yaml")
	writeFile(t, path, docs(svcDoc("web", "1", 80)))
	rec, src := runSource(t, path, never, fast)
	n := rec.expect(t, 0, 0, "update Service demo/web rv=1", "synced")
	for i := range 5 {
		writeFile(t, filepath.Join(dir, "kproxy.log"), strings.Repeat("log line\n", i+1))
		writeFile(t, filepath.Join(dir, ".state.yaml.swp"), "x")
		writeFile(t, filepath.Join(dir, "other.yaml"), docs(svcDoc("other", "1", 80)))
		time.Sleep(2 * fast)
	}
	rec.expect(t, n, quiet)
	if got := src.reloads.Load(); got != 0 {
		t.Fatalf("%d rereads caused by other files", got)
	}
	replaceFile(t, path, docs(svcDoc("web", "2", 80)))
	rec.expect(t, n, quiet, "update Service demo/web rv=2")
	if src.reloads.Load() == 0 {
		t.Fatal("a change of the snapshot itself was not reread")
	}
}

const (
	fast  = 20 * time.Millisecond
	never = time.Hour
	quiet = 300 * time.Millisecond
)

// TestWatchFile changes one file several ways and checks that exactly the
// differences are delivered.
func TestWatchFile(t *testing.T) {
	for _, tc := range []struct {
		name           string
		poll, debounce time.Duration
	}{
		{"notifications", never, fast},
		{"polling only", 50 * time.Millisecond, never},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.yaml")
			writeFile(t, path, docs(svcDoc("web", "1", 80), sliceDoc("web-1", "web", "2"), nodeDoc("node-a", "3")))
			rec := run(t, path, tc.poll, tc.debounce)
			n := rec.expect(t, 0, 0,
				"update Node node-a rv=3", "update Service demo/web rv=1", "update EndpointSlice demo/web-1 rv=2", "synced")

			// A service changed, a slice gone, a node and a service added.
			replaceFile(t, path, docs(svcDoc("web", "4", 8080), svcDoc("api", "5", 80), nodeDoc("node-a", "3"), nodeDoc("node-b", "6")))
			n = rec.expect(t, n, quiet,
				"update Node node-b rv=6", "update Service demo/api rv=5", "update Service demo/web rv=4", "delete EndpointSlice demo/web-1")

			// Written in place; only the content changed (an edited
			// kubectl dump keeps its resourceVersion).
			writeFile(t, path, docs(svcDoc("web", "4", 9090), svcDoc("api", "5", 80), nodeDoc("node-a", "3"), nodeDoc("node-b", "6")))
			n = rec.expect(t, n, quiet, "update Service demo/web rv=4")

			// Rewritten the same: nothing.
			replaceFile(t, path, docs(svcDoc("web", "4", 9090), svcDoc("api", "5", 80), nodeDoc("node-a", "3"), nodeDoc("node-b", "6")))
			n = rec.expect(t, n, quiet)

			// A document that is not YAML: the file may be half
			// written, so nothing of it is used and nothing deleted.
			replaceFile(t, path, docs(svcDoc("web", "4", 9090), "kind: Service\nmetadata: [\n", nodeDoc("node-a", "3"), nodeDoc("node-b", "6")))
			n = rec.expect(t, n, quiet)

			// Written whole again: exactly the differences to what
			// was last used.
			replaceFile(t, path, docs(svcDoc("web", "7", 9090), nodeDoc("node-a", "3"), nodeDoc("node-b", "6")))
			rec.expect(t, n, quiet, "update Service demo/web rv=7", "delete Service demo/api")
		})
	}
}

// TestWatchDirectory adds, changes and removes files in a directory.
func TestWatchDirectory(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "services.yaml"), svcDoc("web", "1", 80))
	rec := run(t, dir, never, fast)
	n := rec.expect(t, 0, 0, "update Service demo/web rv=1", "synced")

	writeFile(t, filepath.Join(dir, "nodes.json"), `{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a", "resourceVersion": "2"}}`)
	n = rec.expect(t, n, quiet, "update Node node-a rv=2")

	// Files the source does not read change nothing.
	writeFile(t, filepath.Join(dir, ".hidden.yaml"), nodeDoc("hidden", "3"))
	writeFile(t, filepath.Join(dir, "notes.txt"), nodeDoc("txt", "3"))
	n = rec.expect(t, n, quiet)

	// Moving an object from one file to another is no change. (A file
	// with no document would be a fault: an empty List says "none".)
	writeFile(t, filepath.Join(dir, "services.yaml"), "# moved\nkind: List\nitems: []\n")
	writeFile(t, filepath.Join(dir, "more.yaml"), svcDoc("web", "1", 80))
	n = rec.expect(t, n, quiet)

	if err := os.Remove(filepath.Join(dir, "nodes.json")); err != nil {
		t.Fatal(err)
	}
	rec.expect(t, n, quiet, "delete Node node-a")
}

// TestWatchEmptiedFile: a file truncated before being written again (as by
// `kubectl get ... > file`) deletes nothing, however long it stays empty;
// a file that says it has no objects (an empty List) deletes them.
func TestWatchEmptiedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.yaml")
	writeFile(t, path, docs(svcDoc("web", "1", 80), nodeDoc("node-a", "2")))
	poll := 100 * time.Millisecond
	rec := run(t, path, poll, fast)
	n := rec.expect(t, 0, 0, "update Node node-a rv=2", "update Service demo/web rv=1", "synced")

	writeFile(t, path, "")
	n = rec.expect(t, n, 5*poll)
	writeFile(t, path, docs(svcDoc("web", "3", 80), nodeDoc("node-a", "2")))
	n = rec.expect(t, n, quiet, "update Service demo/web rv=3")

	writeFile(t, path, "apiVersion: v1\nkind: List\nitems: []\n")
	rec.expect(t, n, quiet, "delete Service demo/web", "delete Node node-a")
}

func TestRunMissingPath(t *testing.T) {
	err := New(filepath.Join(t.TempDir(), "nope.yaml"), Options{}).Run(context.Background(), &recorder{})
	if err == nil {
		t.Fatal("Run on a missing path returned nil")
	}
}

// TestFeed checks the order of the initial delivery.
func TestFeed(t *testing.T) {
	objs, errs := Parse("x.yaml", []byte(docs(sliceDoc("web-1", "web", "1"), svcDoc("web", "2", 80), nodeDoc("node-a", "3"))))
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	rec := &recorder{}
	objs.Feed(rec)
	want := []string{"update Node node-a rv=3", "update Service demo/web rv=2", "update EndpointSlice demo/web-1 rv=1", "synced"}
	if diff := cmp.Diff(want, rec.snapshot()); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}
