package file

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/source"
)

const (
	// defaultPoll is how often files are checked (size, time, inode)
	// even without a notification: a watch can be lost (inotify limits,
	// a symlink whose target changes elsewhere, network file systems).
	defaultPoll = 3 * time.Second
	// defaultDebounce is the quiet time after the last notification
	// before reading: an editor or `kubectl ... > file` makes several
	// changes (truncate, write, rename) for one save.
	defaultDebounce = 200 * time.Millisecond
)

var _ source.Source = (*fileSource)(nil)

type fileSource struct {
	path     string
	poll     time.Duration
	debounce time.Duration
	limit    int64 // largest file read, in bytes
	opts     Options
	// reloads counts rereads (tests check that unrelated files cause none).
	reloads atomic.Int64
	// faulty is set while the last read had a file-level fault.
	faulty bool
}

// Options tune the source.
type Options struct {
	// OnProblem, when set, is called after every read of the files, from
	// Run's goroutine: with "" when every file was good, else with one
	// line naming the first file with a fault and what is wrong with it.
	// The proxy gives it to its health check, which reports the source
	// as stale when the problem lasts.
	OnProblem func(problem string)
}

// New returns a Source that reads path (a file or a directory, see Load)
// and then watches it: on a change it reads everything again and delivers
// only the differences to the previous state (objects added or changed as
// updates, objects gone as deletions). Objects are compared by kind,
// namespace and name, and then by their text (resourceVersion included;
// see state for what counts as a change). A deleted object is given to the
// handler as a stub that holds its namespace and name and, for an
// EndpointSlice, its labels and address type: the source does not keep the
// objects it has delivered.
//
// Changes are noticed through inotify on the directory that holds the file
// (editors and ConfigMap volumes replace files by renaming, which a watch
// on the file itself would not follow) and, as a fallback, by checking the
// files every few seconds.
//
// A file that cannot be used as a whole (faults.go: missing, unreadable,
// not a regular file, too large, empty, not YAML or JSON, cut short) and,
// in directory mode, a directory left without any snapshot file, delete
// nothing: what they gave before is kept until they are good again. Each
// such read is logged (naming the file and the problem) and counted in
// kproxy_source_file_errors_total, and o.OnProblem is told. Removing one
// file of several in directory mode does delete its objects: that is how
// an operator removes them. Writers should replace files atomically
// (write a temporary file, then rename it over the old one).
//
// Run fails if path does not exist at start, or is neither a regular file
// nor a directory; whether it is a file or a directory is fixed then.
// Objects that cannot be used are logged and skipped, as in Parse.
func New(path string, o Options) source.Source {
	return &fileSource{path: path, poll: defaultPoll, debounce: defaultDebounce, limit: maxFileSize, opts: o}
}

// state is what the handler was last given, reduced to what the next
// reread needs: per object, a digest to tell whether it changed and what a
// deletion handler reads of it. The decoded objects are not kept: they
// become garbage once the handler has them (or, for objects it does not
// keep, at once), which at 10k services is tens of MB.
//
// The digest is a SHA-256 of the object's text as read: the item's bytes
// in a JSON file, the document (or List item) as converted to JSON for
// YAML. Hashing the decoded object re-encoded would cost a marshal per
// object per reread, on top of the decoding; the text is at hand and
// hashing it costs little. The price is that some edits that mean nothing
// count as changes and are delivered as updates: a JSON file reformatted,
// keys reordered, a field our API types do not know edited, nil written as
// empty. That is harmless (the handler converts the object again and finds
// the same result). YAML formatting, comments and key order do not count:
// the conversion to JSON sorts keys and drops both. An object moved
// between files is no change when its text is the same.
type state struct {
	services map[objectKey]entry
	slices   map[objectKey]entry
	nodes    map[objectKey]entry
}

// entry is what a state keeps of one object.
type entry struct {
	sum  [sha256.Size]byte
	file string // where it was read from
	// Only for EndpointSlices: what the model.Tracker reads of a deleted
	// slice besides its namespace and name: its address type and its
	// Service (the service-name label; the tracker keeps no object, so
	// the whole label map would be kept here alone).
	addressType discovery.AddressType
	service     string
	hasService  bool
}

func newState() *state {
	return &state{services: map[objectKey]entry{}, slices: map[objectKey]entry{}, nodes: map[objectKey]entry{}}
}

// of returns the entries of one kind.
func (s *state) of(kind string) map[objectKey]entry {
	switch kind {
	case "Service":
		return s.services
	case "EndpointSlice":
		return s.slices
	case "Node":
		return s.nodes
	}
	return nil
}

// Deleted objects are given to the handler as stubs that carry only the
// key and, for slices, the fields in entry.
func serviceStub(k objectKey, _ entry) *v1.Service {
	return &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}}
}

func sliceStub(k objectKey, e entry) *discovery.EndpointSlice {
	var labels map[string]string
	if e.hasService {
		labels = map[string]string{discovery.LabelServiceName: e.service}
	}
	return &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name, Labels: labels}, AddressType: e.addressType}
}

func nodeStub(k objectKey, _ entry) *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: k.Name}}
}

// Run implements source.Source.
func (s *fileSource) Run(ctx context.Context, h model.EventHandler) error {
	st, err := os.Stat(s.path)
	if err != nil {
		return fmt.Errorf("file source: %w", err)
	}
	if !st.IsDir() && !st.Mode().IsRegular() {
		return fmt.Errorf("file source: %w", notRegular(s.path, st.Mode()))
	}
	if s.limit == 0 {
		s.limit = maxFileSize
	}
	opts := loadOptions{dir: st.IsDir(), limit: s.limit}
	dir := s.path
	single := !st.IsDir()
	if single {
		dir = filepath.Dir(s.path)
	}
	// relevant tells whether an event in the watched directory concerns
	// the snapshot: its own file, or (directory mode) a file Load reads.
	// Anything else (a log written next to the snapshot, an editor's swap
	// file) must not trigger a reread, or a log of the rereads would
	// itself cause one every debounce period.
	relevant := func(name string) bool {
		base := filepath.Base(name)
		if single {
			return base == filepath.Base(s.path)
		}
		// ConfigMap volumes switch files by renaming the "..data" link;
		// the directory itself may be removed.
		return wantedFile(base) || strings.HasPrefix(base, "..") || filepath.Clean(name) == filepath.Clean(s.path)
	}

	// Watch before the first read, so that a change made while reading is
	// not missed.
	var events <-chan fsnotify.Event
	var watchErrs <-chan error
	var watcher *fsnotify.Watcher
	if w, err := fsnotify.NewWatcher(); err != nil {
		klog.ErrorS(err, "Cannot watch files, polling only", "path", s.path, "interval", s.poll)
	} else {
		defer w.Close()
		if err := w.Add(dir); err != nil {
			klog.ErrorS(err, "Cannot watch directory, polling only", "directory", dir, "interval", s.poll)
		} else {
			events, watchErrs, watcher = w.Events, w.Errors, w
		}
	}

	stamp := stampOf(s.path, opts.dir)
	cur := s.initialState(opts, h)

	var (
		debounce = time.NewTimer(0)
		poll     = time.NewTicker(s.poll)
	)
	<-debounce.C
	defer debounce.Stop()
	defer poll.Stop()

	reload := func(why string) {
		s.reloads.Add(1)
		if watcher != nil && s.faulty {
			// The watched directory may have been removed and made
			// again: the old watch is gone with it. Adding a watch
			// that exists changes nothing.
			if err := watcher.Add(dir); err != nil {
				klog.V(4).InfoS("Cannot watch directory yet", "directory", dir, "err", err)
			}
		}
		stamp = stampOf(s.path, opts.dir)
		_, errs, res := load(s.path, opts, cur)
		n := deliverDiff(cur, res.state, res.objects, h)
		cur = res.state
		s.report(res.faults)
		klog.V(2).InfoS("Reread object files", "path", s.path, "trigger", why, "changes", n, "errors", len(errs), "fileFaults", len(res.faults))
	}

	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			if !relevant(ev.Name) {
				continue
			}
			klog.V(5).InfoS("File event", "event", ev.String())
			debounce.Reset(s.debounce)
		case err, ok := <-watchErrs:
			if !ok {
				watchErrs = nil
				continue
			}
			// Typically a queue overflow: events were lost, so read.
			klog.ErrorS(err, "File watch error", "path", s.path)
			debounce.Reset(s.debounce)
		case <-debounce.C:
			reload("change notification")
		case <-poll.C:
			if !slices.Equal(stamp, stampOf(s.path, opts.dir)) {
				reload("poll")
			}
		}
	}
}

// initialState reads the path and gives everything to h, as Run does at
// start.
func (s *fileSource) initialState(o loadOptions, h model.EventHandler) *state {
	objs, errs, res := load(s.path, o, nil)
	klog.InfoS("Read objects from files", "path", s.path, "services", len(objs.Services),
		"endpointSlices", len(objs.EndpointSlices), "nodes", len(objs.Nodes), "errors", len(errs), "fileFaults", len(res.faults))
	objs.Feed(h)
	s.report(res.faults)
	return res.state
}

// report logs and counts the faults of one read and tells OnProblem.
func (s *fileSource) report(faults []*FileError) {
	for _, f := range faults {
		klog.ErrorS(f.Err, "Snapshot file cannot be used, keeping the objects it gave before (nothing deleted)",
			"file", f.File, "reason", f.Reason)
	}
	countFaults(faults)
	if len(faults) == 0 {
		metrics.SourceFileLastGoodTimestamp.SetToCurrentTime()
		if s.faulty {
			klog.InfoS("Snapshot files are good again", "path", s.path)
		}
	}
	s.faulty = len(faults) > 0
	if s.opts.OnProblem != nil {
		s.opts.OnProblem(problemOf(faults))
	}
}

// deliverDiff gives h what changed from cur to next and returns how many
// events it sent; objects are next's objects by key. next must have been
// loaded with cur (or nil) as prev: an object left out of objects must be
// unchanged from cur. Updates come before deletions, and nodes, services
// and slices in that order (the reverse for deletions), each sorted by key,
// so that the same change always gives the same events.
func deliverDiff(cur, next *state, objects map[objectKey]any, h model.EventHandler) int {
	n := 0
	n += updates(cur.nodes, next.nodes, objects, h.NodeUpdated)
	n += updates(cur.services, next.services, objects, h.ServiceUpdated)
	n += updates(cur.slices, next.slices, objects, h.EndpointSliceUpdated)
	n += deletions(cur.slices, next.slices, sliceStub, h.EndpointSliceDeleted)
	n += deletions(cur.services, next.services, serviceStub, h.ServiceDeleted)
	n += deletions(cur.nodes, next.nodes, nodeStub, h.NodeDeleted)
	return n
}

// updates delivers the objects of next that are not in cur or whose
// digest differs.
func updates[T any](cur, next map[objectKey]entry, objects map[objectKey]any, f func(T)) int {
	n := 0
	for _, k := range sortedKeys(next) {
		if old, ok := cur[k]; ok && old.sum == next[k].sum {
			continue
		}
		f(objects[k].(T))
		n++
	}
	return n
}

// deletions delivers stubs of the objects of cur that are not in next.
func deletions[T any](cur, next map[objectKey]entry, stub func(objectKey, entry) T, f func(T)) int {
	n := 0
	for _, k := range sortedKeys(cur) {
		if _, ok := next[k]; !ok {
			f(stub(k, cur[k]))
			n++
		}
	}
	return n
}

// fileStamp identifies one version of a file without reading it.
type fileStamp struct {
	name  string
	mode  os.FileMode
	size  int64
	mtime int64 // nanoseconds
	inode uint64
}

// stampOf stamps the files load would read, of any type (a FIFO put where
// a file was, or taken away again, is a change); a path with a fault of
// its own gives nil.
func stampOf(path string, dir bool) []fileStamp {
	files, err := filesOf(path, dir)
	if err != nil {
		return nil
	}
	out := make([]fileStamp, 0, len(files))
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			out = append(out, fileStamp{name: f})
			continue
		}
		out = append(out, fileStamp{name: f, mode: st.Mode(), size: st.Size(), mtime: st.ModTime().UnixNano(), inode: inodeOf(st)})
	}
	return out
}
