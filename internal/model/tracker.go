package model

import (
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networking "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/metrics"
)

// EventHandler receives Kubernetes objects from a source. Updated means added
// or changed. Synced is called once the source has delivered its initial
// state; no sync may run before that.
type EventHandler interface {
	ServiceUpdated(svc *v1.Service)
	ServiceDeleted(svc *v1.Service)
	EndpointSliceUpdated(s *discovery.EndpointSlice)
	EndpointSliceDeleted(s *discovery.EndpointSlice)
	NodeUpdated(n *v1.Node)
	NodeDeleted(n *v1.Node)
	// ServiceCIDRsUpdated hands over every ServiceCIDR the source knows,
	// after each change (the complete list, as upstream's
	// OnServiceCIDRsChanged). Sources that have none never call it.
	ServiceCIDRsUpdated(all []*networking.ServiceCIDR)
	Synced()
}

// FamilyDelta is what changed in one IP family since the last Take. A nil
// ServicePort means the port is gone; a nil endpoint list means no endpoints.
type FamilyDelta struct {
	Services  map[ServicePortName]*ServicePort
	Endpoints map[ServicePortName][]*Endpoint
}

// Update is what changed since the last Take.
type Update struct {
	Families map[v1.IPFamily]*FamilyDelta
	// Node is set when this node's object changed (nil: unchanged).
	Node *Node
	// NodeDeleted is set when this node's object was deleted.
	NodeDeleted bool
	// ServiceCIDRsChanged is set when the set of service CIDRs changed;
	// ServiceCIDRs is then the new set (of every family, sorted).
	ServiceCIDRsChanged bool
	ServiceCIDRs        []netip.Prefix
	// ServiceChanges and EndpointChanges count the events folded in.
	ServiceChanges, EndpointChanges int
	// TriggerTimes holds, per IP family and service whose endpoints of
	// that family changed, the earliest last-change-trigger-time seen
	// since the last Take. The family is the changed slice's address
	// type: as upstream's per-family change trackers, a change to an IPv4
	// slice is measured in IPv4 only.
	TriggerTimes map[v1.IPFamily]map[types.NamespacedName]time.Time
}

// Empty reports whether the update carries no change.
func (u *Update) Empty() bool {
	if u.Node != nil || u.NodeDeleted || u.ServiceCIDRsChanged {
		return false
	}
	for _, d := range u.Families {
		if len(d.Services) > 0 || len(d.Endpoints) > 0 {
			return false
		}
	}
	return true
}

// TrackerOptions configure a Tracker.
type TrackerOptions struct {
	// Hostname is this node's name: endpoints on it are local, and only
	// this Node object is tracked.
	Hostname string
	// Families are the IP families this node proxies, primary first.
	Families []v1.IPFamily
	// OnInvalid is called (without locks held) for every skipped object
	// or part of one, in addition to a log line and the
	// kproxy_invalid_objects_total metric. Optional.
	OnInvalid func(*InvalidError)
	// OnChange is called (without locks held) after every event that
	// changed something. Optional; the proxy uses it to request a sync.
	OnChange func()
}

// Tracker folds source events into per-family deltas. It converts each
// object when its event arrives, so the work of a sync follows the number of
// changed objects, not the size of the cluster. Safe for concurrent use.
type Tracker struct {
	opts TrackerOptions

	mu     sync.Mutex
	synced bool
	// Converted service ports by service, and the names the consumer was
	// last given (to emit deletions).
	services     map[types.NamespacedName][]*ServicePort
	sentServices map[types.NamespacedName][]*ServicePort
	// slices are each service's EndpointSlices, converted when their
	// event arrives: the API objects are not kept (in file mode nothing
	// else would hold them, and they were a fifth of the process's heap).
	slices      map[types.NamespacedName][]*convertedSlice
	sentEps     map[types.NamespacedName][]slicePort
	dirtySvcs   sets.Set[types.NamespacedName]
	dirtyEps    sets.Set[types.NamespacedName]
	node        *Node
	nodeDirty   bool
	nodeDeleted bool
	svcEvents   int
	epEvents    int
	// serviceCIDRs is the current set, sentCIDRs the one last taken.
	serviceCIDRs, sentCIDRs []netip.Prefix
	cidrsDirty              bool
	triggers                map[v1.IPFamily]map[types.NamespacedName]time.Time
	// start is when the tracker was made: older trigger times describe
	// changes made before the proxy ran and are not measured (as upstream),
	// or the first sync would report hours of latency.
	start time.Time
}

var _ EventHandler = (*Tracker)(nil)

// NewTracker returns an empty tracker.
func NewTracker(opts TrackerOptions) *Tracker {
	if len(opts.Families) == 0 {
		opts.Families = []v1.IPFamily{IPv4}
	}
	return &Tracker{
		opts:         opts,
		services:     map[types.NamespacedName][]*ServicePort{},
		sentServices: map[types.NamespacedName][]*ServicePort{},
		slices:       map[types.NamespacedName][]*convertedSlice{},
		sentEps:      map[types.NamespacedName][]slicePort{},
		dirtySvcs:    sets.New[types.NamespacedName](),
		dirtyEps:     sets.New[types.NamespacedName](),
		triggers:     newTriggers(opts.Families),
		start:        time.Now(),
	}
}

// newTriggers returns an empty trigger time map for each family.
func newTriggers(fams []v1.IPFamily) map[v1.IPFamily]map[types.NamespacedName]time.Time {
	m := make(map[v1.IPFamily]map[types.NamespacedName]time.Time, len(fams))
	for _, f := range fams {
		m[f] = map[types.NamespacedName]time.Time{}
	}
	return m
}

// Families returns the IP families tracked.
func (t *Tracker) Families() []v1.IPFamily { return t.opts.Families }

func (t *Tracker) report(errs []*InvalidError) {
	for _, e := range errs {
		msg := "Skipping invalid part of object"
		if e.Whole {
			msg = "Skipping invalid object"
		}
		klog.ErrorS(nil, msg, "kind", e.Kind, "object", e.Object, "field", e.Field, "reason", e.Reason, "category", e.Category)
		metrics.InvalidObjectsTotal.WithLabelValues(e.Kind, e.Category).Inc()
		if t.opts.OnInvalid != nil {
			t.opts.OnInvalid(e)
		}
	}
}

func (t *Tracker) changed() {
	if t.opts.OnChange != nil {
		t.opts.OnChange()
	}
}

// ServiceUpdated implements EventHandler.
func (t *Tracker) ServiceUpdated(svc *v1.Service) {
	ports, errs := ConvertService(svc, t.opts.Families)
	t.report(errs)
	if why := SkipService(svc); why != "" {
		klog.V(4).InfoS("Service not proxied", "service", klog.KObj(svc), "reason", why)
	}
	key := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	t.mu.Lock()
	if ports == nil {
		delete(t.services, key)
	} else {
		t.services[key] = flattenPorts(ports)
	}
	t.dirtySvcs.Insert(key)
	t.svcEvents++
	t.mu.Unlock()
	t.changed()
}

// ServiceDeleted implements EventHandler.
func (t *Tracker) ServiceDeleted(svc *v1.Service) {
	key := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	t.mu.Lock()
	delete(t.services, key)
	t.dirtySvcs.Insert(key)
	t.svcEvents++
	t.mu.Unlock()
	t.changed()
}

// EndpointSliceUpdated implements EventHandler.
func (t *Tracker) EndpointSliceUpdated(s *discovery.EndpointSlice) {
	// A slice the API server would refuse, or that names no service, is
	// skipped whole: as if absent, so that an update that makes a known
	// slice invalid removes what it had, the same as on a fresh start.
	errs := ValidateEndpointSlice(s)
	key, ok := ServiceKeyOfSlice(s)
	if len(errs) == 0 && !ok {
		errs = []*InvalidError{noServiceLabel(s)}
	}
	if len(errs) > 0 {
		t.report(errs)
		t.forgetSlice(s.Namespace, s.Name)
		return
	}
	if !proxiedAddressType(s) {
		return
	}
	why := skipSlice(s)
	var conv *convertedSlice
	if why == "" {
		var errs []*InvalidError
		conv, errs = convertSlice(s, t.opts.Hostname, t.opts.Families)
		// Reported without the lock, so that OnInvalid may call the tracker.
		t.report(errs)
	}
	t.mu.Lock()
	if why != "" {
		// Upstream's informers list only slices without these labels: to
		// them a slice that gains one is deleted.
		if t.sliceIndex(key, s.Name) < 0 {
			t.mu.Unlock()
			klog.V(4).InfoS("EndpointSlice not proxied", "endpointSlice", klog.KObj(s), "reason", why)
			return
		}
		t.deleteSliceLocked(key, s.Name, sliceFamily(s))
		t.mu.Unlock()
		t.changed()
		return
	}
	if i := t.sliceIndex(key, s.Name); i >= 0 {
		t.slices[key][i] = conv
	} else {
		// Kept sorted by name, the order a duplicate endpoint is
		// resolved in (see mergeSlices).
		list := t.slices[key]
		i, _ := slices.BinarySearchFunc(list, s.Name, func(c *convertedSlice, name string) int { return strings.Compare(c.name, name) })
		t.slices[key] = slices.Insert(list, i, conv)
	}
	t.dirtyEps.Insert(key)
	t.epEvents++
	if tt, ok := TriggerTime(s); ok && tt.After(t.start) {
		// Families not proxied have no map: nothing to measure there.
		if byService := t.triggers[sliceFamily(s)]; byService != nil {
			if old, ok := byService[key]; !ok || tt.Before(old) {
				byService[key] = tt
			}
		}
	}
	t.mu.Unlock()
	t.changed()
}

// EndpointSliceDeleted implements EventHandler.
func (t *Tracker) EndpointSliceDeleted(s *discovery.EndpointSlice) {
	if !proxiedAddressType(s) {
		return
	}
	key, ok := ServiceKeyOfSlice(s)
	if !ok {
		return
	}
	t.mu.Lock()
	t.deleteSliceLocked(key, s.Name, sliceFamily(s))
	t.mu.Unlock()
	t.changed()
}

// forgetSlice removes a slice that is now invalid, under whichever service
// it was kept (its service-name label may be what became invalid). A scan
// of the services, but invalid slices are rare.
func (t *Tracker) forgetSlice(namespace, name string) {
	t.mu.Lock()
	found := false
	for key := range t.slices {
		if key.Namespace == namespace && t.sliceIndex(key, name) >= 0 {
			// Its address type may be what became invalid.
			t.deleteSliceLocked(key, name, t.opts.Families...)
			found = true
		}
	}
	t.mu.Unlock()
	if found {
		t.changed()
	}
}

// sliceIndex is the index of a service's slice in t.slices, or -1.
func (t *Tracker) sliceIndex(key types.NamespacedName, name string) int {
	return slices.IndexFunc(t.slices[key], func(c *convertedSlice) bool { return c.name == name })
}

// deleteSliceLocked removes a service's slice. A deleted slice's trigger
// time says when it was last written, not when it was deleted; upstream
// stops measuring the service then, in the slice's family (fams).
func (t *Tracker) deleteSliceLocked(key types.NamespacedName, name string, fams ...v1.IPFamily) {
	for _, f := range fams {
		delete(t.triggers[f], key)
	}
	if i := t.sliceIndex(key, name); i >= 0 {
		t.slices[key] = slices.Delete(t.slices[key], i, i+1)
	}
	if len(t.slices[key]) == 0 {
		delete(t.slices, key)
	}
	t.dirtyEps.Insert(key)
	t.epEvents++
}

// proxiedAddressType tells whether a slice can hold proxied endpoints;
// upstream ignores FQDN (and unknown) slices before counting them.
func proxiedAddressType(s *discovery.EndpointSlice) bool {
	return s.AddressType == discovery.AddressTypeIPv4 || s.AddressType == discovery.AddressTypeIPv6
}

// sliceFamily is the IP family of a proxied slice's addresses.
func sliceFamily(s *discovery.EndpointSlice) v1.IPFamily {
	if s.AddressType == discovery.AddressTypeIPv6 {
		return IPv6
	}
	return IPv4
}

// skipSlice reports why a slice is not proxied, or "". The labels are those
// that upstream's informers select against: the EndpointSlice controller
// copies a Service's labels to its slices and marks headless services'.
func skipSlice(s *discovery.EndpointSlice) string {
	if _, ok := s.Labels[LabelServiceProxyName]; ok {
		return "label " + LabelServiceProxyName + " hands it to another proxy"
	}
	if _, ok := s.Labels[LabelHeadless]; ok {
		return "label " + LabelHeadless
	}
	return ""
}

// NodeUpdated implements EventHandler. Other nodes are ignored.
func (t *Tracker) NodeUpdated(n *v1.Node) {
	if n.Name != t.opts.Hostname {
		return
	}
	node, errs := ConvertNode(n)
	t.report(errs)
	t.mu.Lock()
	// An invalid Node (nil) is as absent: the same as a deleted one.
	t.node, t.nodeDirty, t.nodeDeleted = node, true, node == nil
	t.mu.Unlock()
	t.changed()
}

// NodeDeleted implements EventHandler.
func (t *Tracker) NodeDeleted(n *v1.Node) {
	if n.Name != t.opts.Hostname {
		return
	}
	t.mu.Lock()
	t.node, t.nodeDirty, t.nodeDeleted = nil, true, true
	t.mu.Unlock()
	t.changed()
}

// ServiceCIDRsUpdated implements EventHandler. Only a change of the set of
// CIDRs is passed on (an informer resync re-delivers every object).
func (t *Tracker) ServiceCIDRsUpdated(all []*networking.ServiceCIDR) {
	cidrs, errs := ServiceCIDRPrefixes(all)
	t.report(errs)
	t.mu.Lock()
	if slices.Equal(cidrs, t.serviceCIDRs) {
		t.mu.Unlock()
		return
	}
	t.serviceCIDRs = cidrs
	t.cidrsDirty = !slices.Equal(cidrs, t.sentCIDRs)
	t.mu.Unlock()
	klog.V(2).InfoS("Service CIDRs changed", "cidrs", cidrs)
	t.changed()
}

// Synced implements EventHandler.
func (t *Tracker) Synced() {
	t.mu.Lock()
	t.synced = true
	t.mu.Unlock()
	t.changed()
}

// HasSynced reports whether the source delivered its initial state.
func (t *Tracker) HasSynced() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.synced
}

// Node returns the last known Node (nil if unknown).
func (t *Tracker) Node() *Node {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.node
}

// Pending returns how many service and endpoint events wait for a Take.
func (t *Tracker) Pending() (services, endpoints int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.svcEvents, t.epEvents
}

// flattenPorts lists a service's ports of every family, sorted: a slice
// per service costs a fraction of maps per family and port at 10k
// services.
func flattenPorts(ports map[v1.IPFamily]map[ServicePortName]*ServicePort) []*ServicePort {
	var out []*ServicePort
	for _, byName := range ports {
		for _, sp := range byName {
			out = append(out, sp)
		}
	}
	slices.SortFunc(out, func(a, b *ServicePort) int {
		if c := strings.Compare(string(a.Family), string(b.Family)); c != 0 {
			return c
		}
		return a.Name.Compare(b.Name)
	})
	return slices.Clip(out)
}

// remember records what was sent for a service (the consumer holds the
// same slices), or forgets it when empty.
func remember[T any](m map[types.NamespacedName][]T, key types.NamespacedName, sent []T) {
	if len(sent) == 0 {
		delete(m, key)
		return
	}
	m[key] = sent
}

// Take returns everything that changed since the last Take and resets.
// Invalid objects were reported when their events arrived.
func (t *Tracker) Take() *Update {
	t.mu.Lock()
	defer t.mu.Unlock()
	u := &Update{
		Families:        map[v1.IPFamily]*FamilyDelta{},
		ServiceChanges:  t.svcEvents,
		EndpointChanges: t.epEvents,
		TriggerTimes:    t.triggers,
	}
	for _, f := range t.opts.Families {
		u.Families[f] = &FamilyDelta{Services: map[ServicePortName]*ServicePort{}, Endpoints: map[ServicePortName][]*Endpoint{}}
	}
	for key := range t.dirtySvcs {
		cur := t.services[key]
		for _, p := range t.sentServices[key] {
			if !slices.ContainsFunc(cur, func(c *ServicePort) bool { return c.Family == p.Family && c.Name == p.Name }) {
				u.Families[p.Family].Services[p.Name] = nil
			}
		}
		for _, sp := range cur {
			u.Families[sp.Family].Services[sp.Name] = sp
		}
		remember(t.sentServices, key, cur)
	}
	for key := range t.dirtyEps {
		cur := mergeSlices(t.slices[key])
		for _, p := range t.sentEps[key] {
			if !slices.ContainsFunc(cur, func(c slicePort) bool { return c.family == p.family && c.name == p.name }) {
				u.Families[p.family].Endpoints[p.name] = nil
			}
		}
		for _, c := range cur {
			u.Families[c.family].Endpoints[c.name] = c.eps
		}
		remember(t.sentEps, key, cur)
	}
	if t.nodeDirty {
		u.Node, u.NodeDeleted = t.node, t.nodeDeleted
	}
	if t.cidrsDirty {
		u.ServiceCIDRsChanged, u.ServiceCIDRs = true, t.serviceCIDRs
		t.sentCIDRs, t.cidrsDirty = t.serviceCIDRs, false
	}
	t.dirtySvcs = sets.New[types.NamespacedName]()
	t.dirtyEps = sets.New[types.NamespacedName]()
	t.nodeDirty, t.nodeDeleted = false, false
	t.svcEvents, t.epEvents = 0, 0
	t.triggers = newTriggers(t.opts.Families)
	return u
}
