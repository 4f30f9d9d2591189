// Package apiserver is the source that watches the Kubernetes API server,
// with the list options upstream kube-proxy uses: Services and
// EndpointSlices through client-go reflectors that hand each object over
// and keep none (deliveringStore), this node's Node object and the
// ServiceCIDRs through shared informers.
package apiserver

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networking "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/source"
)

// The list options upstream kube-proxy uses (cmd/kube-proxy/app/server.go).
// The API server applies them, so objects meant for another proxy, headless
// services and other nodes never reach us. They are also checked again on
// our side (see the want* functions): a client that ignores selectors (the
// fake clientset does) or an object that stops matching must not slip in.
var (
	// Services handed to another proxy carry this label; headless
	// services have no cluster IP to program.
	serviceLabelSelector = mustSelector(model.LabelServiceProxyName)
	serviceFieldSelector = fields.OneTermNotEqualSelector("spec.clusterIP", v1.ClusterIPNone).String()
	// Upstream filters slices only on the headless label, and its
	// tracker then drops those that carry the proxy-name label (the
	// EndpointSlice controller copies a Service's labels to its slices).
	// Asking the API server to leave those out too spares every node the
	// bytes and the decoding of another proxy's endpoints; the Tracker
	// drops the same slices, so what is programmed does not change.
	sliceLabelSelector = mustSelector(model.LabelHeadless, model.LabelServiceProxyName)
)

// mustSelector is a label selector matching objects that have none of
// the labels.
func mustSelector(noSuchLabels ...string) string {
	sel := labels.NewSelector()
	for _, l := range noSuchLabels {
		req, err := labels.NewRequirement(l, selection.DoesNotExist, nil)
		if err != nil {
			panic(err)
		}
		sel = sel.Add(*req)
	}
	return sel.String()
}

func nodeFieldSelector(hostname string) string {
	return fields.OneTermEqualSelector("metadata.name", hostname).String()
}

var _ source.Source = (*apiSource)(nil)

type apiSource struct {
	client   kubernetes.Interface
	hostname string
	resync   time.Duration
}

// New returns a Source that watches client. hostname is this node's name:
// only that Node object is watched. resync is the Node and ServiceCIDR
// informers' resync period (the config's configSyncPeriod; 0 disables
// resyncs): each resync re-delivers those objects as updates, as upstream
// does. Services and EndpointSlices are kept by no cache, so there is
// nothing to re-deliver: upstream's resync of them hands its change
// trackers unchanged objects, which they drop (see deliveringStore).
func New(client kubernetes.Interface, hostname string, resync time.Duration) source.Source {
	return &apiSource{client: client, hostname: hostname, resync: resync}
}

// Run implements source.Source.
func (s *apiSource) Run(ctx context.Context, h model.EventHandler) error {
	if s.hostname == "" {
		return errors.New("apiserver source: empty hostname")
	}
	sh := &serialHandler{h: h}

	// Services and EndpointSlices are watched by reflectors that hand
	// every object over and keep none (deliveringStore); the Node and
	// ServiceCIDRs, a few objects, by informers.
	svcStore := newServiceStore(sh.ServiceUpdated, sh.ServiceDeleted)
	sliceStore := newSliceStore(sh.EndpointSliceUpdated, sh.EndpointSliceDeleted)
	reflectors := []*cache.Reflector{
		cache.NewReflectorWithOptions(cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				o.LabelSelector, o.FieldSelector = serviceLabelSelector, serviceFieldSelector
				return s.client.CoreV1().Services(metav1.NamespaceAll).List(ctx, o)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				o.LabelSelector, o.FieldSelector = serviceLabelSelector, serviceFieldSelector
				return s.client.CoreV1().Services(metav1.NamespaceAll).Watch(ctx, o)
			},
		}, s.client), &v1.Service{}, svcStore, cache.ReflectorOptions{Name: "services"}),
		cache.NewReflectorWithOptions(cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				o.LabelSelector = sliceLabelSelector
				return s.client.DiscoveryV1().EndpointSlices(metav1.NamespaceAll).List(ctx, o)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				o.LabelSelector = sliceLabelSelector
				return s.client.DiscoveryV1().EndpointSlices(metav1.NamespaceAll).Watch(ctx, o)
			},
		}, s.client), &discovery.EndpointSlice{}, sliceStore, cache.ReflectorOptions{Name: "endpointslices"}),
	}
	nodeFactory := informers.NewSharedInformerFactoryWithOptions(s.client, s.resync,
		informers.WithTransform(slim),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = nodeFieldSelector(s.hostname)
		}))
	cidrFactory := informers.NewSharedInformerFactoryWithOptions(s.client, s.resync, informers.WithTransform(slim))
	factories := []informers.SharedInformerFactory{nodeFactory, cidrFactory}

	// The Node's handler is registered before its informer starts so that
	// no initial object is missed, and the registration (not the
	// informer) is what we wait for: an informer has synced when its
	// store is full, a registration only once its handler has been given
	// every object of the initial list. A deliveringStore has synced once
	// it has delivered the first list. Each is waited on through its
	// channel, not polled: the first sync follows the last list at once.
	synced := []cache.DoneChecker{svcStore, sliceStore}
	nodeReg, err := nodeFactory.Core().V1().Nodes().Informer().AddEventHandler(handlerFuncs(s.wantNode, sh.NodeUpdated, sh.NodeDeleted))
	errs := []error{err}
	if nodeReg != nil {
		synced = append(synced, nodeReg.HasSyncedChecker())
	}
	// ServiceCIDRs are not waited for, as upstream does not: the first
	// sync runs without them (so without the drop of unallocated cluster
	// IPs) rather than never when they cannot be listed (a ClusterRole
	// from before they were watched).
	cidrInf := cidrFactory.Networking().V1().ServiceCIDRs().Informer()
	if _, err := cidrInf.AddEventHandler(serviceCIDRHandler(cidrInf.GetStore(), sh.ServiceCIDRsUpdated)); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("apiserver source: adding event handlers: %w", err)
	}

	// The informers and reflectors stop with ctx; Shutdown and the wait
	// group then wait for their goroutines, and the handler is closed so
	// that nothing is delivered after Run returns.
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		sh.close()
		stop()
		for _, f := range factories {
			f.Shutdown()
		}
		wg.Wait()
	}()
	for _, f := range factories {
		f.Start(rctx.Done())
	}
	for _, r := range reflectors {
		wg.Go(func() { r.RunWithContext(rctx) })
	}

	klog.InfoS("Waiting for Services, EndpointSlices and Node to sync", "node", s.hostname)
	if !cache.WaitFor(ctx, "", synced...) {
		return fmt.Errorf("apiserver source: caches did not sync: %w", context.Cause(ctx))
	}
	klog.InfoS("Services, EndpointSlices and Node synced", "node", s.hostname)
	sh.Synced()
	<-ctx.Done()
	return nil
}

func wantService(svc *v1.Service) bool {
	_, other := svc.Labels[model.LabelServiceProxyName]
	return !other && svc.Spec.ClusterIP != v1.ClusterIPNone
}

func wantSlice(s *discovery.EndpointSlice) bool {
	_, headless := s.Labels[model.LabelHeadless]
	_, other := s.Labels[model.LabelServiceProxyName]
	return !headless && !other
}

func (s *apiSource) wantNode(n *v1.Node) bool { return n.Name == s.hostname }

// handlerFuncs adapts typed callbacks to an informer handler. An object that
// does not match want is not delivered; one that stops matching is delivered
// as deleted, as the API server's own selector filtering would.
func handlerFuncs[T interface {
	*v1.Service | *discovery.EndpointSlice | *v1.Node
}](want func(T) bool, updated, deleted func(T)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if o, ok := obj.(T); ok && want(o) {
				updated(o)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, ok := newObj.(T)
			if !ok {
				return
			}
			if want(o) {
				updated(o)
				return
			}
			if old, ok := oldObj.(T); ok && want(old) {
				deleted(old)
			}
		},
		DeleteFunc: func(obj any) {
			// When the watch missed the deletion, the informer hands
			// over the last state it knew, wrapped in a tombstone.
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			o, ok := obj.(T)
			if !ok {
				klog.ErrorS(nil, "Unexpected object in delete event", "type", fmt.Sprintf("%T", obj))
				return
			}
			if want(o) {
				deleted(o)
			}
		},
	}
}

// serviceCIDRHandler hands over every ServiceCIDR in store after each event:
// the proxy needs the union of their CIDRs, as upstream's
// OnServiceCIDRsChanged gets it. The informer updates its store before it
// notifies, so the last event's list is the current one.
func serviceCIDRHandler(store cache.Store, updated func([]*networking.ServiceCIDR)) cache.ResourceEventHandlerFuncs {
	all := func(any) {
		var out []*networking.ServiceCIDR
		for _, obj := range store.List() {
			if o, ok := obj.(*networking.ServiceCIDR); ok {
				out = append(out, o)
			}
		}
		updated(out)
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    all,
		UpdateFunc: func(_, newObj any) { all(newObj) },
		DeleteFunc: all,
	}
}

// serialHandler serializes calls from the four informers' goroutines, so a
// handler sees one ordered stream, and drops calls once closed.
type serialHandler struct {
	mu     sync.Mutex
	h      model.EventHandler
	closed bool
}

func (s *serialHandler) do(f func(model.EventHandler)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		f(s.h)
	}
}

func (s *serialHandler) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}

func (s *serialHandler) ServiceUpdated(o *v1.Service) {
	klog.V(5).InfoS("Service updated", "service", klog.KObj(o), "resourceVersion", o.ResourceVersion)
	s.do(func(h model.EventHandler) { h.ServiceUpdated(o) })
}

func (s *serialHandler) ServiceDeleted(o *v1.Service) {
	klog.V(5).InfoS("Service deleted", "service", klog.KObj(o))
	s.do(func(h model.EventHandler) { h.ServiceDeleted(o) })
}

func (s *serialHandler) EndpointSliceUpdated(o *discovery.EndpointSlice) {
	klog.V(5).InfoS("EndpointSlice updated", "endpointSlice", klog.KObj(o), "resourceVersion", o.ResourceVersion)
	s.do(func(h model.EventHandler) { h.EndpointSliceUpdated(o) })
}

func (s *serialHandler) EndpointSliceDeleted(o *discovery.EndpointSlice) {
	klog.V(5).InfoS("EndpointSlice deleted", "endpointSlice", klog.KObj(o))
	s.do(func(h model.EventHandler) { h.EndpointSliceDeleted(o) })
}

func (s *serialHandler) NodeUpdated(o *v1.Node) {
	klog.V(5).InfoS("Node updated", "node", klog.KObj(o), "resourceVersion", o.ResourceVersion)
	s.do(func(h model.EventHandler) { h.NodeUpdated(o) })
}

func (s *serialHandler) NodeDeleted(o *v1.Node) {
	klog.V(5).InfoS("Node deleted", "node", klog.KObj(o))
	s.do(func(h model.EventHandler) { h.NodeDeleted(o) })
}

func (s *serialHandler) ServiceCIDRsUpdated(all []*networking.ServiceCIDR) {
	klog.V(5).InfoS("ServiceCIDRs updated", "count", len(all))
	s.do(func(h model.EventHandler) { h.ServiceCIDRsUpdated(all) })
}

func (s *serialHandler) Synced() {
	s.do(func(h model.EventHandler) { h.Synced() })
}
