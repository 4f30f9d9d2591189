package proxy

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/model"
)

// TestLoopRepair: Repair asks for a sync and makes the next one full,
// once; a family the loop does not program is ignored.
func TestLoopRepair(t *testing.T) {
	ctx := context.Background()
	l, tr, b, clk, _, _ := setup(t)
	requests := 0
	l.opts.Request = func() { requests++ }
	tr.ServiceUpdated(makeService("a", "198.19.0.1"))
	tr.Synced()
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	clk.Step(time.Second)
	l.Repair(model.IPv4)
	l.Repair(model.IPv6)
	if requests != 2 {
		t.Errorf("Repair asked for %d syncs, want 2", requests)
	}
	// With the runner's urgent request, a repair uses that instead.
	urgent := 0
	l.opts.RequestUrgent = func() { urgent++ }
	l.Repair(model.IPv4)
	if urgent != 1 || requests != 2 {
		t.Errorf("Repair with RequestUrgent: %d urgent, %d plain requests; want 1 and 2", urgent, requests)
	}
	l.opts.RequestUrgent = nil
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if len(b.reqs) != 2 || !b.last(t).Full {
		t.Fatalf("after Repair: %d syncs, last full=%v; want a second, full sync", len(b.reqs), b.last(t).Full)
	}
	n := len(b.reqs)
	clk.Step(time.Second)
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if len(b.reqs) != n {
		t.Errorf("the repair was done twice")
	}
}

type fakeChecker struct {
	drift []Drift
	calls int
}

func (c *fakeChecker) CheckDrift(context.Context) ([]Drift, error) {
	c.calls++
	d := c.drift
	c.drift = nil
	return d, nil
}

// TestCheckDrifts: drift found by a checker is counted by kind and its
// family repaired; the schedule respects Min.
func TestCheckDrifts(t *testing.T) {
	l, _, _, _, _, _ := setup(t)
	repaired := make(chan struct{}, 4)
	l.opts.Request = func() { repaired <- struct{}{} }
	c := &fakeChecker{drift: []Drift{{Family: model.IPv4, Kind: "chain", Name: "nat/KUBE-SERVICES", Change: "flushed"}}}
	before := testutil.ToFloat64(metrics.RulesDriftTotal.WithLabelValues("test", "chain"))
	checkUntilRepair(t, repaired, func(ctx context.Context) {
		l.CheckDrifts(ctx, "test", map[v1.IPFamily]DriftChecker{model.IPv4: c}, DriftCheckOptions{Min: 20 * time.Millisecond, Max: time.Second})
	})
	if got := testutil.ToFloat64(metrics.RulesDriftTotal.WithLabelValues("test", "chain")); got != before+1 {
		t.Errorf("kproxy_rules_drift_total{mode=test,kind=chain} went from %v to %v, want +1", before, got)
	}
	l.repairMu.Lock()
	if !l.repair[model.IPv4] {
		t.Errorf("IPv4 not marked for repair")
	}
	l.repairMu.Unlock()
}

// repairingBackend is a recordingBackend told what to repair.
type repairingBackend struct {
	recordingBackend
	want bool
}

func (b *repairingBackend) WantsRepair() bool { return b.want }

// TestLoopRepairSoon: RepairSoon asks for an urgent sync that is not full,
// and a backend that wants a repair is synced even with nothing changed.
func TestLoopRepairSoon(t *testing.T) {
	ctx := context.Background()
	tr := model.NewTracker(model.TrackerOptions{Hostname: "node-a", Families: []v1.IPFamily{model.IPv4}})
	b := &repairingBackend{}
	clk := clocktesting.NewFakeClock(time.Now())
	urgent := 0
	l := New(Options{Tracker: tr, Backends: map[v1.IPFamily]Backend{model.IPv4: b}, SyncPeriod: 30 * time.Second,
		FullSyncPeriod: DefaultFullSyncPeriod, Clock: clk, RequestUrgent: func() { urgent++ }})
	tr.ServiceUpdated(makeService("a", "198.19.0.1"))
	tr.Synced()
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	clk.Step(time.Second)
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if len(b.reqs) != 1 {
		t.Fatalf("%d backend calls with nothing to do, want 1", len(b.reqs))
	}
	b.want = true
	l.RepairSoon()
	if urgent != 1 {
		t.Errorf("RepairSoon made %d urgent requests, want 1", urgent)
	}
	clk.Step(time.Second)
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if len(b.reqs) != 2 || b.last(t).Full {
		t.Fatalf("%d backend calls, last full=%v; want a second, partial sync for the repair", len(b.reqs), len(b.reqs) == 2 && b.reqs[1].Full)
	}
}

// choosyTableRepairer takes the tables it is told of when take is set.
type choosyTableRepairer struct {
	repairingBackend
	take bool
	told [][]string
}

func (b *choosyTableRepairer) RepairTables(tables []string) {
	b.told = append(b.told, tables)
	b.want = b.take
}

// TestLoopRepairTables: a backend that takes the tables gets a sync that
// need not be full; one that does not, or is no TableRepairer, a full one.
func TestLoopRepairTables(t *testing.T) {
	tr := model.NewTracker(model.TrackerOptions{Hostname: "node-a", Families: []v1.IPFamily{model.IPv4, model.IPv6}})
	taker := &choosyTableRepairer{take: true}
	plain := &recordingBackend{}
	urgent := 0
	l := New(Options{Tracker: tr, Backends: map[v1.IPFamily]Backend{model.IPv4: taker, model.IPv6: plain}, SyncPeriod: 30 * time.Second,
		Clock: clocktesting.NewFakeClock(time.Now()), RequestUrgent: func() { urgent++ }})
	clear(l.needFull)
	l.RepairTables(model.IPv4, []string{"kube-proxy"})
	if len(taker.told) != 1 || taker.told[0][0] != "kube-proxy" || urgent != 1 || l.repair[model.IPv4] {
		t.Errorf("taken: told %v, %d urgent requests, full repair %v; want told once, 1, false", taker.told, urgent, l.repair[model.IPv4])
	}
	taker.take = false
	l.RepairTables(model.IPv4, []string{"kube-proxy"})
	if urgent != 2 || !l.repair[model.IPv4] {
		t.Errorf("not taken: %d urgent requests, full repair %v; want 2, true", urgent, l.repair[model.IPv4])
	}
	l.RepairTables(model.IPv6, []string{"kube-proxy"})
	if urgent != 3 || !l.repair[model.IPv6] {
		t.Errorf("no TableRepairer: %d urgent requests, full repair %v; want 3, true", urgent, l.repair[model.IPv6])
	}
}

// TestCheckBackendDrifts: the backend that can check drift is checked,
// busy told of each check, and its family repaired; the one that cannot
// is left alone.
func TestCheckBackendDrifts(t *testing.T) {
	tr := model.NewTracker(model.TrackerOptions{Hostname: "node-a", Families: []v1.IPFamily{model.IPv4, model.IPv6}})
	repaired := make(chan struct{}, 4)
	l := New(Options{Tracker: tr, Backends: map[v1.IPFamily]Backend{model.IPv4: &driftingBackend{}, model.IPv6: &recordingBackend{}},
		SyncPeriod: 30 * time.Second, Clock: clocktesting.NewFakeClock(time.Now()), Request: func() { repaired <- struct{}{} }})
	clear(l.needFull)
	busy := &countingBusy{}
	checkUntilRepair(t, repaired, func(ctx context.Context) {
		l.CheckBackendDrifts(ctx, "test", busy, DriftCheckOptions{Min: 20 * time.Millisecond, Max: time.Second})
	})
	if busy.begins == 0 || busy.begins != busy.ends {
		t.Errorf("busy told of %d check starts and %d ends; want as many, at least one", busy.begins, busy.ends)
	}
	l.repairMu.Lock()
	defer l.repairMu.Unlock()
	if !l.repair[model.IPv4] || l.repair[model.IPv6] {
		t.Errorf("repairs %v; want IPv4 only", l.repair)
	}
}

// checkUntilRepair runs check until a repair is requested on repaired,
// then stops it.
func checkUntilRepair(t *testing.T, repaired <-chan struct{}, check func(ctx context.Context)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		check(ctx)
		close(done)
	}()
	select {
	case <-repaired:
	case <-time.After(5 * time.Second):
		t.Fatal("no repair requested")
	}
	cancel()
	<-done
}

// pacedChecker has nothing to compare for its first idle calls, then
// takes cost per check and records when each check began.
type pacedChecker struct {
	idle   int
	cost   time.Duration
	starts chan time.Time
}

func (c *pacedChecker) CheckDrift(context.Context) ([]Drift, error) {
	if c.idle > 0 {
		c.idle--
		return nil, ErrNothingToCompare
	}
	c.starts <- time.Now()
	time.Sleep(c.cost)
	return nil, nil
}

// TestCheckDriftsPacesFromTheFirstCheck: the rounds before the first sync,
// which read nothing, are not taken for what a check costs: the check
// after the first one waits CostFactor times its cost, not Min.
func TestCheckDriftsPacesFromTheFirstCheck(t *testing.T) {
	l, _, _, _, _, _ := setup(t)
	c := &pacedChecker{idle: 3, cost: 30 * time.Millisecond, starts: make(chan time.Time, 2)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		l.CheckDrifts(ctx, "test", map[v1.IPFamily]DriftChecker{model.IPv4: c}, DriftCheckOptions{Min: 5 * time.Millisecond, Max: 10 * time.Second, CostFactor: 10})
		close(done)
	}()
	defer func() {
		cancel()
		<-done
	}()
	var starts []time.Time
	for len(starts) < 2 {
		select {
		case s := <-c.starts:
			starts = append(starts, s)
		case <-time.After(5 * time.Second):
			t.Fatalf("%d checks in 5 s, want 2", len(starts))
		}
	}
	// The first check took at least 30 ms; its pause at least 300 ms.
	if gap := starts[1].Sub(starts[0]); gap < 300*time.Millisecond {
		t.Errorf("the second check began %v after the first, which took 30 ms; want at least 10 times that", gap)
	}
}
