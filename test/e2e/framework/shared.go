package framework

// The shared control plane: one etcd and kube-apiserver for every test of a
// test binary, started by the first test that asks for it and stopped by
// StopShared (from TestMain, after m.Run). Starting one costs seconds on a
// quiet machine and far more on a busy one; a package of tests that each
// started their own spent most of its time there.
//
// Tests share it one after the other, never in parallel. Each leaves the
// API as it found it: Shared registers a cleanup that deletes every object
// the test created (Reset) and restarts kube-apiserver with its own flags
// if the test stopped it or ran it with others (WithAPIServerArgs).
// Processes a test starts (kproxy) are stopped by the test's own cleanups,
// which run before that one.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// tb is what the framework needs of a lifetime (see Lifetime).
type tb = Lifetime

// Bounds of the shared control plane's per-test work.
const (
	// resetTimeout bounds Reset: deleting a benchmark's 10 000 Services
	// one by one on a loaded machine takes minutes.
	resetTimeout = 5 * time.Minute
	// resetWorkers delete objects concurrently.
	resetWorkers = 8
)

var shared struct {
	mu      sync.Mutex
	started bool
	opts    Options
	cp      *ControlPlane
	err     error // why starting failed: every later Shared fails with it
	life    *suite
}

// Shared returns the test binary's shared control plane, starting it with
// opts on first use (skipping or failing like Start where the machine
// cannot run it). Every caller must pass the same opts: a test that needs
// other API server flags for a while uses WithAPIServerArgs. t must not run
// in parallel with another test using it.
//
// The cluster t gets holds only what the API server itself made (the
// system namespaces, the "kubernetes" Service and its endpoints, the
// bootstrap RBAC objects, the default ServiceCIDR): Shared checks so, and
// removes what an earlier test left, before returning. In t.Cleanup (after
// the cleanups t registers later, its processes' among them) the API
// server is brought back to Start's flags and running, and Reset deletes
// whatever t created; a failure there fails t.
func Shared(t testing.TB, opts Options) *ControlPlane {
	t.Helper()
	if reason := SkipReason(); reason != "" {
		if Mandatory() {
			t.Fatalf("%s=1 but: %s", EnvRun, reason)
		}
		t.Skip(reason)
	}
	shared.mu.Lock()
	if !shared.started {
		shared.started = true
		shared.opts = opts
		shared.life = &suite{}
		began := time.Now()
		shared.err = shared.life.run(func() { shared.cp = start(shared.life, opts) })
		if shared.err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			shared.err = shared.cp.takeBaseline(ctx)
			cancel()
		}
		if shared.err != nil {
			shared.cp = nil
			if err := shared.life.close(); err != nil {
				shared.err = fmt.Errorf("%w; tearing down: %v", shared.err, err)
			}
		} else {
			t.Logf("shared control plane in netns %s ready after %s (%d objects in its baseline)",
				shared.cp.Namespace, time.Since(began).Round(time.Millisecond), len(shared.cp.baseline))
		}
	}
	cp, err, first := shared.cp, shared.err, shared.opts
	shared.mu.Unlock()
	if err != nil {
		t.Fatalf("shared control plane: %v", err)
	}
	if !reflect.DeepEqual(opts, first) {
		t.Fatalf("Shared: options %+v differ from those the shared control plane started with, %+v", opts, first)
	}

	if err := cp.restoreAPIServer(); err != nil {
		t.Fatalf("shared control plane: kube-apiserver: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), resetTimeout)
	removed, err := cp.Reset(ctx)
	cancel()
	if err != nil {
		t.Fatalf("shared control plane: not as it started: %v", err)
	}
	if len(removed) > 0 {
		t.Logf("shared control plane: removed %d objects an earlier test left: %s", len(removed), summary(removed))
	}
	t.Cleanup(func() {
		if err := cp.restoreAPIServer(); err != nil {
			t.Errorf("shared control plane: kube-apiserver: %v", err)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), resetTimeout)
		defer cancel()
		removed, err := cp.Reset(ctx)
		if err != nil {
			t.Errorf("shared control plane: putting the API back as it was: %v", err)
		}
		if len(removed) > 0 {
			t.Logf("shared control plane: deleted %d objects the test created", len(removed))
		}
	})
	return cp
}

// StopShared stops the shared control plane, if one was started, and
// deletes everything it made. TestMain calls it after m.Run; the error
// says what could not be cleaned up.
func StopShared() error {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.life == nil {
		return nil
	}
	err := shared.life.close()
	shared.started, shared.cp, shared.err, shared.life = false, nil, nil, nil
	return err
}

// objectKey names one API object.
type objectKey struct {
	resource, namespace, name string
}

func (k objectKey) String() string {
	if k.namespace == "" {
		return k.resource + "/" + k.name
	}
	return k.resource + "/" + k.namespace + "/" + k.name
}

// trackedResources are what Reset looks at: every kind the tests create,
// and what kproxy reads. Deletion goes in this order: namespaced objects
// first (a namespace is finalized once it is empty), IPAddresses after the
// Services holding them.
var trackedResources = []schema.GroupVersionResource{
	{Version: "v1", Resource: "services"},
	{Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices"},
	{Version: "v1", Resource: "endpoints"},
	{Version: "v1", Resource: "pods"},
	{Version: "v1", Resource: "configmaps"},
	{Version: "v1", Resource: "secrets"},
	{Version: "v1", Resource: "serviceaccounts"},
	{Version: "v1", Resource: "events"},
	{Group: "apps", Version: "v1", Resource: "daemonsets"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "roles"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"},
	{Version: "v1", Resource: "nodes"},
	{Group: "networking.k8s.io", Version: "v1", Resource: "servicecidrs"},
	{Group: "networking.k8s.io", Version: "v1", Resource: "ipaddresses"},
	{Version: "v1", Resource: "namespaces"},
}

// apiObject is one listed object.
type apiObject struct {
	key objectKey
	gvr schema.GroupVersionResource
	// deleting: it has a deletion timestamp; finalizers are its
	// metadata.finalizers.
	deleting   bool
	finalizers []string
}

// dynamicClient is a client for Reset, with a higher rate limit than
// Client's (a benchmark leaves thousands of objects).
func (cp *ControlPlane) dynamicClient() (dynamic.Interface, error) {
	cfg := rest.CopyConfig(cp.Config)
	cfg.QPS, cfg.Burst = 500, 1000
	// Listing v1 Endpoints draws a deprecation warning each time.
	cfg.WarningHandler = rest.NoWarnings{}
	return dynamic.NewForConfig(cfg)
}

// list lists every tracked object.
func (cp *ControlPlane) list(ctx context.Context, dyn dynamic.Interface) ([]apiObject, error) {
	var objs []apiObject
	for _, gvr := range trackedResources {
		l, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("listing %s: %w", gvr.Resource, err)
		}
		for _, o := range l.Items {
			objs = append(objs, apiObject{
				key:        objectKey{gvr.Resource, o.GetNamespace(), o.GetName()},
				gvr:        gvr,
				deleting:   o.GetDeletionTimestamp() != nil,
				finalizers: o.GetFinalizers(),
			})
		}
	}
	return objs, nil
}

// takeBaseline waits until the API server has made what it makes on its
// own after /readyz (the endpoints of the "kubernetes" Service, the default
// ServiceCIDR), then records every tracked object as the baseline Reset
// returns to.
func (cp *ControlPlane) takeBaseline(ctx context.Context) error {
	dyn, err := cp.dynamicClient()
	if err != nil {
		return err
	}
	if err := cp.waitSettled(ctx); err != nil {
		return err
	}
	objs, err := cp.list(ctx, dyn)
	if err != nil {
		return err
	}
	cp.baseline = map[objectKey]bool{}
	for _, o := range objs {
		cp.baseline[o.key] = true
	}
	return nil
}

// waitSettled waits until the "kubernetes" Service has an endpoint in its
// EndpointSlice and the default ServiceCIDR exists: on a fresh or
// restarted API server both follow /readyz by a moment.
func (cp *ControlPlane) waitSettled(ctx context.Context) error {
	var last error
	for {
		last = func() error {
			eps, err := cp.Client.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).List(ctx,
				metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=kubernetes"})
			if err != nil {
				return err
			}
			n := 0
			for _, s := range eps.Items {
				n += len(s.Endpoints)
			}
			if n == 0 {
				return errors.New(`the "kubernetes" Service has no endpoint yet`)
			}
			_, err = cp.Client.NetworkingV1().ServiceCIDRs().Get(ctx, "kubernetes", metav1.GetOptions{})
			return err
		}()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("API server not settled: %w (last: %v)", ctx.Err(), last)
		case <-time.After(pollInterval):
		}
	}
}

// Reset deletes every tracked object that was not there when the shared
// control plane became ready (namespaces are finalized by hand once empty,
// and finalizers are removed from what would wait for a controller: none
// runs), waits until they are gone, and checks that the baseline's objects
// are all still there and that the API server has settled. It returns the
// objects it deleted. For the shared control plane only (Shared calls it
// before and after each test).
func (cp *ControlPlane) Reset(ctx context.Context) ([]objectKey, error) {
	if cp.baseline == nil {
		return nil, errors.New("Reset: not the shared control plane")
	}
	dyn, err := cp.dynamicClient()
	if err != nil {
		return nil, err
	}
	removed := map[objectKey]bool{}
	for {
		objs, err := cp.list(ctx, dyn)
		if err != nil {
			return nil, err
		}
		var extra []apiObject
		busy := map[string]bool{} // namespaces still holding extra objects
		present := map[objectKey]bool{}
		for _, o := range objs {
			present[o.key] = true
			if cp.baseline[o.key] {
				continue
			}
			extra = append(extra, o)
			removed[o.key] = true
			if o.key.namespace != "" {
				busy[o.key.namespace] = true
			}
		}
		if len(extra) == 0 {
			var missing []string
			for k := range cp.baseline {
				if !present[k] {
					missing = append(missing, k.String())
				}
			}
			if len(missing) > 0 {
				sort.Strings(missing)
				return keys(removed), fmt.Errorf("objects the API server had at the start are gone (a test deleted them): %s",
					strings.Join(missing, ", "))
			}
			if err := cp.waitSettled(ctx); err != nil {
				return keys(removed), err
			}
			return keys(removed), nil
		}
		if ctx.Err() != nil {
			var left []objectKey
			for _, o := range extra {
				left = append(left, o.key)
			}
			return keys(removed), fmt.Errorf("%w: still there: %s", ctx.Err(), summary(left))
		}
		errs := parallel(extra, func(o apiObject) error { return cp.remove(ctx, dyn, o, busy) })
		if err := errors.Join(errs...); err != nil && ctx.Err() == nil {
			return keys(removed), err
		}
		select {
		case <-ctx.Done():
		case <-time.After(pollInterval):
		}
	}
}

// remove takes one step towards o's removal: delete it; once it is being
// deleted, drop the finalizers nothing would ever act on (a namespace's
// only once busy says it is empty).
func (cp *ControlPlane) remove(ctx context.Context, dyn dynamic.Interface, o apiObject, busy map[string]bool) error {
	var client dynamic.ResourceInterface = dyn.Resource(o.gvr)
	if o.key.namespace != "" {
		client = dyn.Resource(o.gvr).Namespace(o.key.namespace)
	}
	var err error
	switch {
	case !o.deleting:
		err = client.Delete(ctx, o.key.name, metav1.DeleteOptions{})
	case o.gvr.Resource == "namespaces":
		if busy[o.key.name] {
			return nil
		}
		var ns *corev1.Namespace
		ns, err = cp.Client.CoreV1().Namespaces().Get(ctx, o.key.name, metav1.GetOptions{})
		if err == nil && len(ns.Spec.Finalizers) > 0 {
			ns.Spec.Finalizers = nil
			_, err = cp.Client.CoreV1().Namespaces().Finalize(ctx, ns, metav1.UpdateOptions{})
		}
	case len(o.finalizers) > 0:
		_, err = client.Patch(ctx, o.key.name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	}
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("removing %s: %w", o.key, err)
	}
	return nil
}

// parallel runs f on every item with resetWorkers goroutines and returns
// the errors.
func parallel[T any](items []T, f func(T) error) []error {
	errs := make([]error, len(items))
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(resetWorkers, len(items)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				errs[i] = f(items[i])
			}
		}()
	}
	for i := range items {
		work <- i
	}
	close(work)
	wg.Wait()
	return errs
}

func keys(m map[objectKey]bool) []objectKey {
	ks := make([]objectKey, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.SortFunc(ks, func(a, b objectKey) int { return strings.Compare(a.String(), b.String()) })
	return ks
}

// summary names up to ten objects.
func summary(ks []objectKey) string {
	var names []string
	for i, k := range ks {
		if i == 10 {
			names = append(names, fmt.Sprintf("and %d more", len(ks)-10))
			break
		}
		names = append(names, k.String())
	}
	return strings.Join(names, ", ")
}

// suite is the shared control plane's lifetime: from the first Shared to
// StopShared. Cleanups run in reverse order, as a test's do; Fatalf ends
// the function run is running.
type suite struct {
	// name starts its log lines; "shared control plane" when empty.
	name     string
	mu       sync.Mutex
	cleanups []func()
	errs     []error
}

// suiteFatal is the panic value of suite.Fatalf.
type suiteFatal struct{ err error }

func (s *suite) Helper() {}

func (s *suite) Cleanup(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cleanups = append(s.cleanups, f)
}

func (s *suite) Errorf(format string, args ...any) {
	err := fmt.Errorf(format, args...)
	s.mu.Lock()
	s.errs = append(s.errs, err)
	s.mu.Unlock()
	fmt.Fprintf(os.Stderr, "%s: %v\n", s.logName(), err)
}

func (s *suite) Fatalf(format string, args ...any) {
	err := fmt.Errorf(format, args...)
	s.mu.Lock()
	s.errs = append(s.errs, err)
	s.mu.Unlock()
	panic(suiteFatal{err})
}

func (s *suite) Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s: %s\n", s.logName(), fmt.Sprintf(format, args...))
}

func (s *suite) logName() string {
	if s.name == "" {
		return "shared control plane"
	}
	return s.name
}

func (s *suite) Failed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.errs) > 0
}

// sharedDirPrefix starts the name of the shared control plane's
// directories: kpe2e-shared-PID-random, so that those of a test binary
// killed before StopShared (a -timeout panic) are recognised and removed by
// the next run (sweepStaleDirs).
const sharedDirPrefix = "kpe2e-shared-"

func (s *suite) TempDir() string {
	sweepDirsOnce.Do(sweepStaleDirs)
	dir, err := os.MkdirTemp("", sharedDirPrefix+strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		s.Fatalf("temporary directory: %v", err)
	}
	s.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			s.Errorf("removing %s: %v", dir, err)
		}
	})
	return dir
}

var sweepDirsOnce sync.Once

// sweepStaleDirs removes the shared control-plane directories of test
// binaries that no longer run (etcd's data, logs, credentials).
func sweepStaleDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), sharedDirPrefix+"*"))
	for _, d := range dirs {
		pid, _, ok := strings.Cut(strings.TrimPrefix(filepath.Base(d), sharedDirPrefix), "-")
		if !ok || pid == strconv.Itoa(os.Getpid()) {
			continue
		}
		if _, err := strconv.Atoi(pid); err != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join("/proc", pid)); err == nil {
			continue // its test binary is still running
		}
		_ = os.RemoveAll(d)
	}
}

// run runs f, turning a Fatalf inside it into an error.
func (s *suite) run(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			fatal, ok := r.(suiteFatal)
			if !ok {
				panic(r)
			}
			err = fatal.err
		}
	}()
	f()
	return nil
}

// close runs the cleanups, newest first, and returns every error reported
// while the suite lived.
func (s *suite) close() error {
	for {
		s.mu.Lock()
		n := len(s.cleanups)
		if n == 0 {
			s.mu.Unlock()
			break
		}
		f := s.cleanups[n-1]
		s.cleanups = s.cleanups[:n-1]
		s.mu.Unlock()
		_ = s.run(f) // a Fatalf is recorded in errs
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(s.errs...)
}
