// Package proxy runs the sync loop shared by every mode: it takes what the
// change tracker collected, folds it into each IP family's State, decides
// between a partial and a full sync, hands the work to the mode's Backend,
// and reports the outcome to metrics and the health server.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kproxy/kproxy/internal/kernel/conntrack"
	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/runner"
)

// RenderInput is what every backend renders one sync from, whatever
// else its own Input adds (each backend's Input embeds it).
type RenderInput struct {
	State    *model.State
	NodeName string
	Zone     string
	// Changed are the service ports to re-render in a partial sync.
	Changed sets.Set[model.ServicePortName]
}

// Request is one sync's work for one IP family.
type Request struct {
	State *model.State
	// Changed are the service ports whose service or endpoints changed
	// since the last successful sync of this family.
	Changed sets.Set[model.ServicePortName]
	Node    *model.Node
	// ServiceCIDRs are the ServiceCIDR objects' CIDRs of this family
	// (empty when none are known). A change forces a full sync.
	ServiceCIDRs []netip.Prefix
	// Full asks the backend to rewrite everything.
	Full bool
	// Trial marks the syncs of failure isolation (isolate.go), which
	// follow a failed sync. A trial holds a subset of the services: a
	// backend that can check its input without committing it (nf_tables'
	// check-only batch, iptables-restore --test) only checks it and
	// leaves its applied state alone, so that no service is without
	// rules while the culprit is looked for; the isolation's last sync
	// (not a trial) programs what passed. A backend that cannot must at
	// least leave the kernel unchanged when a trial fails.
	Trial bool
	Now   time.Time
}

// Result is what a backend reports after a successful sync.
type Result struct {
	// HealthCheckPorts and LocalEndpoints feed the health check node
	// port server (services with externalTrafficPolicy: Local).
	HealthCheckPorts map[types.NamespacedName]uint16
	LocalEndpoints   map[types.NamespacedName]int
	// NoLocalEndpoints counts services whose Local policy has no local
	// endpoint, by traffic policy ("internal", "external").
	NoLocalEndpoints map[string]int
	// CleanupPending asks for another sync soon even if nothing changes:
	// the backend deferred work (deletions) to keep this sync fast.
	CleanupPending bool
	// CleanupAfter is when that work falls due (0: one second).
	CleanupAfter time.Duration
}

// Backend programs one IP family of one mode.
type Backend interface {
	Sync(ctx context.Context, req *Request) (*Result, error)
}

// HealthReporter is the part of the proxy health server the loop drives.
type HealthReporter interface {
	QueuedUpdate(v1.IPFamily)
	Updated(v1.IPFamily)
	// Failed says a family's sync failed: its rules are not in place.
	Failed(v1.IPFamily)
}

// ServiceHealth is the part of the health check node port server the loop drives.
type ServiceHealth interface {
	SyncServices(map[types.NamespacedName]uint16) error
	SyncEndpoints(map[types.NamespacedName]int) error
}

// Options configure a Loop.
type Options struct {
	Tracker  *model.Tracker
	Backends map[v1.IPFamily]Backend
	// SyncPeriod: a sync runs at least this often (one with nothing to
	// do calls no backend but counts as a successful sync, as upstream's
	// periodic sync).
	SyncPeriod time.Duration
	// FullSyncPeriod: a full sync runs at least this often; 0 makes it
	// SyncPeriod. The modes that notice drift by themselves (nftables,
	// iptables) use DefaultFullSyncPeriod, as upstream's proxiers do;
	// ipvs mode repairs through its full sync every SyncPeriod.
	FullSyncPeriod time.Duration
	Clock          clock.PassiveClock
	Health         HealthReporter // optional
	Services       ServiceHealth  // optional
	// Request asks for another sync; Run's runner when nil. Optional.
	Request func()
	// RequestUrgent asks for a sync that does not wait out
	// min-sync-period (the runner's RequestUrgent), for repairs. Without
	// it, Request is used. Optional.
	RequestUrgent func()
	// RequestCleanup asks for a low-priority sync after a delay (the
	// runner's RequestCleanup), for a backend's deferred clean-up; such a
	// sync does not hold back the next change by min-sync-period. Without
	// it, Request is used. Optional.
	RequestCleanup func(after time.Duration)
	// MinSyncPeriod and RetryInterval pace Run's syncs: at most one per
	// MinSyncPeriod (repairs and changes aside, see package runner), and
	// a failed one again after RetryInterval; SyncPeriod bounds the time
	// between two. A Loop whose RetryInterval is 0 has no Run: its owner
	// calls Sync (tests).
	MinSyncPeriod, RetryInterval time.Duration
	// BeforeSync runs before each of Run's syncs and AfterSync after it,
	// whatever its outcome (the clean-up of the mode the node ran before;
	// the release of idle memory, which waits for no sync to run).
	// Optional.
	BeforeSync, AfterSync func(ctx context.Context)
	// ParallelFamilies lets the families' backends sync at the same time
	// (each on its own goroutine), for modes whose families share no
	// kernel object and no adapter state: nftables mode (a table and a
	// netlink socket per family). The backends, OnRefused and the
	// metrics must then be safe for concurrent use across families.
	ParallelFamilies bool
	// OnRefused is called for each service port the kernel refused, which
	// every later sync leaves out until it changes or is retried (see
	// isolate.go). Optional.
	OnRefused func(f v1.IPFamily, name model.ServicePortName, err error)
}

// DefaultFullSyncPeriod is upstream's proxyutil.FullSyncPeriod: how
// often its iptables and nftables proxiers rewrite everything when no
// change asks for it. Between full syncs, their periodic sync (every
// --sync-period) is partial. kproxy keeps the hourly full sync in
// iptables mode also where upstream drops it (more than 1000 endpoints:
// "large cluster mode"): its drift check compares rule counts, not rule
// text, and at 10k services a full sync costs kproxy ~12 s an hour.
const DefaultFullSyncPeriod = time.Hour

// Loop is the level-triggered sync: every call of Sync reconciles the
// kernel with everything the tracker has seen.
type Loop struct {
	opts Options
	// run paces Run's syncs (nil without Options.RetryInterval); ctx is
	// Run's, for the syncs it makes.
	run *runner.Runner
	ctx context.Context

	mu       sync.Mutex
	states   map[v1.IPFamily]*model.State
	pending  map[v1.IPFamily]sets.Set[model.ServicePortName]
	needFull map[v1.IPFamily]bool
	lastFull map[v1.IPFamily]time.Time
	cleanup  map[v1.IPFamily]bool
	// cleanupAfter: when each family's deferred clean-up falls due.
	cleanupAfter map[v1.IPFamily]time.Duration
	// refused: per family, the service ports the kernel refused, left out
	// of the state the backend gets; retrying: those given another try in
	// the current sync.
	refused  map[v1.IPFamily]map[model.ServicePortName]refusal
	retrying map[v1.IPFamily]map[model.ServicePortName]refusal
	node     *model.Node
	// serviceCIDRs: of every family, as the tracker last reported them.
	serviceCIDRs []netip.Prefix
	// triggers: per family, the trigger times of that family's endpoint
	// changes not yet applied.
	triggers map[v1.IPFamily]map[types.NamespacedName]time.Time

	// repair: families Repair asked a full sync for (drift.go); its own
	// lock, as Repair is called while a sync holds mu.
	repairMu sync.Mutex
	repair   map[v1.IPFamily]bool
}

// New creates a loop; the first sync of each family is full.
func New(opts Options) *Loop {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	l := &Loop{
		opts:         opts,
		states:       map[v1.IPFamily]*model.State{},
		pending:      map[v1.IPFamily]sets.Set[model.ServicePortName]{},
		needFull:     map[v1.IPFamily]bool{},
		lastFull:     map[v1.IPFamily]time.Time{},
		cleanup:      map[v1.IPFamily]bool{},
		cleanupAfter: map[v1.IPFamily]time.Duration{},
		refused:      map[v1.IPFamily]map[model.ServicePortName]refusal{},
		retrying:     map[v1.IPFamily]map[model.ServicePortName]refusal{},
		triggers:     map[v1.IPFamily]map[types.NamespacedName]time.Time{},
		repair:       map[v1.IPFamily]bool{},
	}
	if opts.RetryInterval > 0 {
		clk, ok := opts.Clock.(clock.WithTicker)
		if !ok {
			clk = clock.RealClock{}
		}
		l.run = runner.New("sync-runner", func() error {
			if !l.opts.Tracker.HasSynced() {
				// Not a sync: the runner starts no min-sync-period
				// for it, so the first sync runs when the sources
				// report synced, not a min-sync-period later.
				return errNotSynced
			}
			if l.opts.BeforeSync != nil {
				l.opts.BeforeSync(l.ctx)
			}
			err := l.Sync(l.ctx)
			if l.opts.AfterSync != nil {
				l.opts.AfterSync(l.ctx)
			}
			return err
		}, opts.MinSyncPeriod, opts.SyncPeriod, opts.RetryInterval, clk)
		if l.opts.Request == nil {
			l.opts.Request = l.run.Request
		}
		if l.opts.RequestUrgent == nil {
			l.opts.RequestUrgent = l.run.RequestUrgent
		}
		if l.opts.RequestCleanup == nil {
			l.opts.RequestCleanup = l.run.RequestCleanup
		}
	}
	for f := range opts.Backends {
		l.states[f] = model.NewState(f)
		l.pending[f] = sets.New[model.ServicePortName]()
		l.needFull[f] = true
		l.triggers[f] = map[types.NamespacedName]time.Time{}
		l.refused[f] = map[model.ServicePortName]refusal{}
		l.retrying[f] = map[model.ServicePortName]refusal{}
	}
	return l
}

// Run syncs until ctx is done, paced by Options' periods: the first sync
// as soon as the sources have synced (no min-sync-period before it), then
// on changes (Changed), repairs and deferred clean-ups, and at least every
// SyncPeriod. It needs Options.RetryInterval.
func (l *Loop) Run(ctx context.Context) {
	if l.run == nil {
		panic("proxy.Loop.Run without Options.RetryInterval")
	}
	l.ctx = ctx
	l.run.Run(ctx)
}

// errNotSynced is what Run's syncs return before the sources synced.
var errNotSynced = fmt.Errorf("sources have not synced yet: %w", runner.ErrNotReady)

// Changed tells the loop that the tracker has news: the health server
// hears that work is waiting, and a sync is asked for once the sources
// have synced (as upstream's proxiers ask only once initialized). The
// tracker's Synced reports a change too, which asks for the first sync.
// Wire it to the tracker's OnChange.
func (l *Loop) Changed() {
	l.QueuedUpdate()
	if l.opts.Request != nil && l.opts.Tracker.HasSynced() {
		l.opts.Request()
	}
}

// QueuedUpdate tells the health server that work is waiting; Changed
// calls it.
func (l *Loop) QueuedUpdate() {
	for f := range l.opts.Backends {
		if l.opts.Health != nil {
			l.opts.Health.QueuedUpdate(f)
		}
		metrics.SyncProxyRulesLastQueuedTimestamp.WithLabelValues(string(f)).SetToCurrentTime()
	}
	svc, eps := l.opts.Tracker.Pending()
	metrics.ServiceChangesPending.Set(float64(svc))
	metrics.EndpointChangesPending.Set(float64(eps))
}

// programmed is the number of service ports of a family that its last
// successful sync programmed: all of its state but the refused ones.
func (l *Loop) programmed(f v1.IPFamily) int {
	n := 0
	for name := range l.states[f].Services {
		if _, refused := l.refused[f][name]; !refused {
			n++
		}
	}
	return n
}

// State returns a copy of one family's current state (for debugging and tests).
func (l *Loop) State(f v1.IPFamily) *model.State {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s, ok := l.states[f]; ok {
		return s.Clone()
	}
	return nil
}

// Sync runs one sync of every family. It never panics on bad input: a
// failing family is retried in full at the next sync while the others go on.
func (l *Loop) Sync(ctx context.Context) error {
	if !l.opts.Tracker.HasSynced() {
		klog.V(2).InfoS("Not syncing: sources have not synced yet")
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.takeRepairs()

	modelStart := l.opts.Clock.Now()
	u := l.opts.Tracker.Take()
	metrics.ServiceChangesTotal.Add(float64(u.ServiceChanges))
	metrics.EndpointChangesTotal.Add(float64(u.EndpointChanges))
	metrics.ServiceChangesPending.Set(0)
	metrics.EndpointChangesPending.Set(0)
	if u.Node != nil || u.NodeDeleted {
		if nodeNeedsFull(l.node, u.Node) {
			if l.node == nil {
				// At start the Node comes with the first sync, which
				// is full anyway: no extra sync, nothing to wait for.
				klog.V(2).InfoS("Node known; next sync is full", "node", u.Node.Name)
			} else {
				klog.V(2).InfoS("Node changed in a way that affects rules; next sync is full")
			}
			for f := range l.needFull {
				l.needFull[f] = true
			}
		}
		l.node = u.Node
	}
	if u.ServiceCIDRsChanged {
		// Only full syncs write the rules that use them (nftables mode's
		// drop of unallocated cluster IPs).
		klog.V(2).InfoS("Service CIDRs changed; next sync is full", "cidrs", u.ServiceCIDRs)
		l.serviceCIDRs = u.ServiceCIDRs
		for f := range l.needFull {
			l.needFull[f] = true
		}
	}
	for f, st := range l.states {
		l.pending[f].Insert(st.Apply(u.Families[f]).UnsortedList()...)
		// Each lost claim was logged once by Apply; count it once too.
		if n := len(st.NewlyLost()); n > 0 {
			metrics.InvalidObjectsTotal.WithLabelValues("Service", "contested").Add(float64(n))
		}
		for kind, n := range st.Contested() {
			metrics.ContestedAddresses.WithLabelValues(string(f), kind.String()).Set(float64(n))
		}
	}
	// Each family measures the changes of its own slices (upstream's
	// proxier per family records its own change tracker's times).
	for f := range l.triggers {
		for svc, t := range u.TriggerTimes[f] {
			if old, ok := l.triggers[f][svc]; !ok || t.Before(old) {
				l.triggers[f][svc] = t
			}
		}
	}

	// The model's share of the sync (folding the changes into every
	// family's state), logged beside each family's sync time.
	modelSeconds := l.opts.Clock.Since(modelStart).Seconds()
	var errs []error
	// Each family's work is decided first, then the backends sync (at
	// once with ParallelFamilies), then the outcomes are recorded in
	// family order.
	var work []*familySync
	for _, f := range l.families() {
		b := l.opts.Backends[f]
		now := l.opts.Clock.Now()
		full := l.needFull[f] || now.Sub(l.lastFull[f]) >= l.fullSyncPeriod()
		if w, ok := b.(FullSyncWanter); ok && !full && w.WantsFullSync() {
			full = true
		}
		view, retried := l.view(f, now)
		l.pending[f].Insert(retried.UnsortedList()...)
		if w, ok := b.(RepairWanter); !full && l.pending[f].Len() == 0 && !l.cleanup[f] && (!ok || !w.WantsRepair()) {
			// The kernel holds what the state says: a successful sync
			// (upstream's periodic sync sets the timestamp too; alerts
			// on a stale one must not fire on a quiet cluster).
			metrics.SyncProxyRulesLastTimestamp.WithLabelValues(string(f)).SetToCurrentTime()
			if l.opts.Health != nil {
				l.opts.Health.Updated(f)
			}
			l.observeTriggers(f, now)
			continue
		}
		work = append(work, &familySync{f: f, b: b, now: now, full: full,
			req: &Request{State: view, Changed: l.pending[f], Node: l.node, ServiceCIDRs: model.PrefixesOf(l.serviceCIDRs, f), Full: full, Now: now}})
	}
	l.syncBackends(ctx, work)
	for _, w := range work {
		f, full, now, res, err := w.f, w.full, w.now, w.res, w.err
		elapsed := w.seconds
		fam := string(f)
		metrics.SyncProxyRulesLatency.WithLabelValues(fam).Observe(elapsed)
		if full {
			metrics.SyncFullProxyRulesLatency.WithLabelValues(fam).Observe(elapsed)
		} else {
			metrics.SyncPartialProxyRulesLatency.WithLabelValues(fam).Observe(elapsed)
		}
		if err != nil {
			// Keep the pending set: nothing of it is known to be applied.
			klog.ErrorS(err, "Sync failed; the next sync will be full", "ipFamily", f, "full", full)
			l.needFull[f] = true
			if l.opts.Health != nil {
				l.opts.Health.Failed(f)
			}
			errs = append(errs, fmt.Errorf("%s sync: %w", f, err))
			continue
		}
		klog.V(2).InfoS("Synced", "ipFamily", f, "full", full, "changedServicePorts", l.pending[f].Len(), "seconds", elapsed, "modelSeconds", modelSeconds)
		l.pending[f] = sets.New[model.ServicePortName]()
		l.needFull[f] = false
		if full {
			l.lastFull[f] = now
		}
		metrics.SyncProxyRulesLastTimestamp.WithLabelValues(fam).SetToCurrentTime()
		metrics.ServicePorts.WithLabelValues(fam).Set(float64(l.programmed(f)))
		if l.opts.Health != nil {
			l.opts.Health.Updated(f)
		}
		l.observeTriggers(f, w.done)
		if res != nil {
			l.cleanup[f] = res.CleanupPending
			l.cleanupAfter[f] = res.CleanupAfter
			for policy, n := range res.NoLocalEndpoints {
				// By name: the label order is upstream's (traffic_policy,
				// ip_family), easy to get backwards positionally.
				metrics.SyncProxyRulesNoLocalEndpointsTotal.With(prometheus.Labels{
					metrics.LabelTrafficPolicy: policy, metrics.LabelIPFamily: fam,
				}).Set(float64(n))
			}
			// Health check ports are per service, not per family; the
			// primary family's backend is authoritative.
			if l.opts.Services != nil && f == l.opts.Tracker.Families()[0] {
				if err := l.opts.Services.SyncServices(res.HealthCheckPorts); err != nil {
					klog.ErrorS(err, "Failed to sync health check node ports")
				}
				if err := l.opts.Services.SyncEndpoints(res.LocalEndpoints); err != nil {
					klog.ErrorS(err, "Failed to sync health check endpoint counts")
				}
			}
		}
	}
	var cleanupAfter time.Duration
	for f, pending := range l.cleanup {
		if !pending {
			continue
		}
		d := l.cleanupAfter[f]
		if d <= 0 {
			d = time.Second
		}
		if cleanupAfter == 0 || d < cleanupAfter {
			cleanupAfter = d
		}
	}
	switch {
	case cleanupAfter == 0:
	case l.opts.RequestCleanup != nil:
		l.opts.RequestCleanup(cleanupAfter)
	case l.opts.Request != nil:
		l.opts.Request()
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return nil
}

// familySync is one family's backend sync within a Sync of the loop.
type familySync struct {
	f       v1.IPFamily
	b       Backend
	req     *Request
	full    bool
	now     time.Time
	res     *Result
	err     error
	seconds float64
	// done is when this family's sync ended: its changes' network
	// programming latency ends there, not when the other family's does.
	done time.Time
}

// families returns the families that have a backend, the tracker's
// (primary first) before any other, each once.
func (l *Loop) families() []v1.IPFamily {
	out := make([]v1.IPFamily, 0, len(l.opts.Backends))
	for _, f := range l.opts.Tracker.Families() {
		if _, ok := l.opts.Backends[f]; ok && !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	for f := range l.opts.Backends {
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out
}

// syncBackends runs each family's backend sync (and, after a failure, the
// failure isolation, which touches only that family's part of the loop).
// With ParallelFamilies and more than one family they run at once, as
// upstream's two proxiers of a dual-stack node do: a node's first sync
// takes as long as its slowest family, not as long as both.
func (l *Loop) syncBackends(ctx context.Context, work []*familySync) {
	one := func(w *familySync) {
		start := l.opts.Clock.Now()
		w.res, w.err = w.b.Sync(ctx, w.req)
		if w.err != nil {
			w.res, w.err = l.isolate(ctx, w.f, w.b, w.req, w.err)
		} else {
			clear(l.retrying[w.f])
		}
		w.done = l.opts.Clock.Now()
		w.seconds = w.done.Sub(start).Seconds()
	}
	if !l.opts.ParallelFamilies || len(work) < 2 {
		for _, w := range work {
			one(w)
		}
		return
	}
	var wg sync.WaitGroup
	for _, w := range work {
		wg.Go(func() { one(w) })
	}
	wg.Wait()
}

// fullSyncPeriod is Options.FullSyncPeriod, SyncPeriod when unset.
func (l *Loop) fullSyncPeriod() time.Duration {
	if l.opts.FullSyncPeriod > 0 {
		return l.opts.FullSyncPeriod
	}
	return l.opts.SyncPeriod
}

// observeTriggers records network programming latency for every change
// this family has applied by done.
func (l *Loop) observeTriggers(f v1.IPFamily, done time.Time) {
	for svc, t := range l.triggers[f] {
		metrics.NetworkProgrammingLatency.WithLabelValues(string(f)).Observe(done.Sub(t).Seconds())
		delete(l.triggers[f], svc)
	}
}

// nodeNeedsFull reports whether a node change affects rules of every
// service: topology labels, pod CIDRs (NodeCIDR local detection) or addresses.
func nodeNeedsFull(old, cur *model.Node) bool {
	if old == nil || cur == nil {
		return old != cur
	}
	return !maps.Equal(old.Labels, cur.Labels) || fmt.Sprint(old.PodCIDRs) != fmt.Sprint(cur.PodCIDRs) ||
		fmt.Sprint(old.Addresses) != fmt.Sprint(cur.Addresses)
}

// HostHandles are the host interfaces every backend's Handles embed next
// to its own kernel interface.
type HostHandles struct {
	// Conntrack clears stale UDP entries; nil: none are cleared.
	Conntrack conntrack.Interface
	// LocalAddrs reads the host's addresses (for CIDR
	// nodePortAddresses); nil: the Node's addresses stand in.
	LocalAddrs func() ([]netip.Addr, error)
}

// CheckFamily refuses a family other than IPv4 and IPv6, naming the
// backend that was given it.
func CheckFamily(backend string, f v1.IPFamily) error {
	if f != model.IPv4 && f != model.IPv6 {
		return fmt.Errorf("%s: unknown IP family %q", backend, f)
	}
	return nil
}

// CheckNew refuses what a backend's NewProxier cannot work with: a family
// other than IPv4 and IPv6 (CheckFamily), or no kernel interface
// (kernelMissing; kernel names the interface).
func CheckNew(backend string, f v1.IPFamily, kernelMissing bool, kernel string) error {
	if err := CheckFamily(backend, f); err != nil {
		return err
	}
	if kernelMissing {
		return fmt.Errorf("%s: no %s", backend, kernel)
	}
	return nil
}
