package apiserver

import (
	"fmt"
	"sync"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// deliveringStore is what a client-go Reflector fills in place of an
// informer's cache, for Services and EndpointSlices: it hands every object
// to the handler as it arrives and keeps none. The Tracker converts what
// it is given into its own model and never looks at an object again, so
// an informer's cache would be a second copy of the cluster: at 10k
// services and 108k endpoints about 40 MB of the heap.
//
// What it keeps per object is what delivering its deletion later needs
// (namespace, name, and for a slice its service and address type): a
// relist that no longer holds an object deletes it, as an informer's
// tombstone would.
//
// An informer's periodic resync re-delivers its cached objects unchanged;
// upstream's change trackers drop such updates as no-ops, so there is
// nothing to re-deliver and Resync does nothing. configSyncPeriod still
// resyncs the Node and ServiceCIDR informers.
//
// Every method is called by the reflector's goroutine, one at a time;
// the handler is called on it.
type deliveringStore[T metav1.Object] struct {
	want    func(T) bool
	updated func(T)
	deleted func(T)
	// keep is what is remembered of a delivered object; tomb rebuilds
	// from it the object a deletion is delivered with.
	keep func(T) tombInfo
	tomb func(types.NamespacedName, tombInfo) T

	mu    sync.Mutex
	known map[types.NamespacedName]tombInfo
	// synced is closed once the first list has been delivered: the
	// source waits on it (cache.WaitFor) rather than polling every
	// 100 ms as cache.WaitForCacheSync does, which cost a start up to
	// 0.1 s before the first sync.
	synced     chan struct{}
	syncedOnce sync.Once
}

// tombInfo is what a deletion needs of an object besides its namespace and
// name: for a slice, what the Tracker finds it by; nothing for a Service.
type tombInfo struct {
	addressType discovery.AddressType
	service     string
}

var (
	_ cache.ReflectorStore = (*deliveringStore[*v1.Service])(nil)
	_ cache.DoneChecker    = (*deliveringStore[*v1.Service])(nil)
)

func newServiceStore(updated, deleted func(*v1.Service)) *deliveringStore[*v1.Service] {
	return &deliveringStore[*v1.Service]{
		want: wantService, updated: updated, deleted: deleted,
		keep: func(*v1.Service) tombInfo { return tombInfo{} },
		tomb: func(k types.NamespacedName, _ tombInfo) *v1.Service {
			return &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}}
		},
		known: map[types.NamespacedName]tombInfo{}, synced: make(chan struct{}),
	}
}

// newSliceStore keeps a slice's address type and service name: what the
// Tracker finds a deleted slice by.
func newSliceStore(updated, deleted func(*discovery.EndpointSlice)) *deliveringStore[*discovery.EndpointSlice] {
	return &deliveringStore[*discovery.EndpointSlice]{
		want: wantSlice, updated: updated, deleted: deleted,
		keep: func(s *discovery.EndpointSlice) tombInfo {
			return tombInfo{addressType: s.AddressType, service: s.Labels[discovery.LabelServiceName]}
		},
		tomb: func(k types.NamespacedName, kept tombInfo) *discovery.EndpointSlice {
			s := &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}, AddressType: kept.addressType}
			if kept.service != "" {
				s.Labels = map[string]string{discovery.LabelServiceName: kept.service}
			}
			return s
		},
		known: map[types.NamespacedName]tombInfo{}, synced: make(chan struct{}),
	}
}

func nsName(o metav1.Object) types.NamespacedName {
	return types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}
}

func (s *deliveringStore[T]) object(obj any) (T, error) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	o, ok := obj.(T)
	if !ok {
		var zero T
		return zero, fmt.Errorf("unexpected object of type %T", obj)
	}
	return o, nil
}

// put delivers an added or updated object: as updated when wanted, as
// deleted when it was delivered before and is not wanted any more (it
// gained a label the API server's selector would have filtered it out
// by).
func (s *deliveringStore[T]) put(o T) {
	k := nsName(o)
	s.mu.Lock()
	kept, was := s.known[k]
	if s.want(o) {
		s.known[k] = s.keep(o)
		s.mu.Unlock()
		s.updated(o)
		return
	}
	delete(s.known, k)
	s.mu.Unlock()
	if was {
		s.deleted(s.tomb(k, kept))
	}
}

// Add implements cache.ReflectorStore.
func (s *deliveringStore[T]) Add(obj any) error {
	o, err := s.object(obj)
	if err != nil {
		return err
	}
	s.put(o)
	return nil
}

// Update implements cache.ReflectorStore.
func (s *deliveringStore[T]) Update(obj any) error { return s.Add(obj) }

// Delete implements cache.ReflectorStore. The deletion is delivered as
// the object was last delivered: that is what the Tracker holds.
func (s *deliveringStore[T]) Delete(obj any) error {
	o, err := s.object(obj)
	if err != nil {
		return err
	}
	k := nsName(o)
	s.mu.Lock()
	kept, was := s.known[k]
	delete(s.known, k)
	s.mu.Unlock()
	if was {
		s.deleted(s.tomb(k, kept))
	}
	return nil
}

// Replace implements cache.ReflectorStore: a (re)list. Every object of
// the list is delivered, then the deletion of each delivered before that
// the list no longer holds. The first Replace is the initial sync. An
// object of another type (which a typed client does not list) is logged
// and skipped: an error would make the reflector list again, and fail
// again, forever.
func (s *deliveringStore[T]) Replace(list []any, _ string) error {
	seen := make(map[types.NamespacedName]struct{}, len(list))
	for _, obj := range list {
		o, err := s.object(obj)
		if err != nil {
			klog.ErrorS(err, "Skipped an object of a list")
			continue
		}
		seen[nsName(o)] = struct{}{}
		s.put(o)
	}
	type gone struct {
		k    types.NamespacedName
		kept tombInfo
	}
	var goneList []gone
	s.mu.Lock()
	for k, kept := range s.known {
		if _, ok := seen[k]; !ok {
			goneList = append(goneList, gone{k, kept})
			delete(s.known, k)
		}
	}
	s.mu.Unlock()
	for _, g := range goneList {
		s.deleted(s.tomb(g.k, g.kept))
	}
	s.syncedOnce.Do(func() { close(s.synced) })
	return nil
}

// Resync implements cache.ReflectorStore: nothing to re-deliver (see the
// type's comment).
func (s *deliveringStore[T]) Resync() error { return nil }

// hasSynced reports whether the first list has been delivered.
func (s *deliveringStore[T]) hasSynced() bool {
	select {
	case <-s.synced:
		return true
	default:
		return false
	}
}

// Name implements cache.DoneChecker.
func (s *deliveringStore[T]) Name() string {
	var zero T
	return fmt.Sprintf("%T store", zero)
}

// Done implements cache.DoneChecker: closed once the first list has been
// delivered.
func (s *deliveringStore[T]) Done() <-chan struct{} { return s.synced }
