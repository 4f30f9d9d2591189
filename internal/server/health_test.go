package server

import (
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

const healthTimeout = 10 * time.Second

// op is one event fed to ProxyHealth: a queued update, a finished sync, or
// time passing.
type op struct {
	queued  v1.IPFamily
	updated v1.IPFamily
	step    time.Duration
}

func apply(clk *clocktesting.FakeClock, h *ProxyHealth, ops []op) {
	for _, o := range ops {
		if o.queued != "" {
			h.QueuedUpdate(o.queued)
		}
		if o.updated != "" {
			h.Updated(o.updated)
		}
		clk.Step(o.step)
	}
}

func TestProxyHealth(t *testing.T) {
	v4, v6 := v1.IPv4Protocol, v1.IPv6Protocol
	for _, tc := range []struct {
		name        string
		ops         []op
		wantHealthy bool
		wantStatus  map[v1.IPFamily]ProxierHealth
		wantLast    time.Time
	}{{
		name:        "fresh",
		wantHealthy: true,
		wantStatus:  map[v1.IPFamily]ProxierHealth{},
	}, {
		name:        "queued but never synced counts as starting up",
		ops:         []op{{queued: v4, step: time.Hour}},
		wantHealthy: true,
		wantStatus:  map[v1.IPFamily]ProxierHealth{},
	}, {
		name:        "synced, no pending update",
		ops:         []op{{updated: v4, step: time.Hour}},
		wantHealthy: true,
		wantStatus:  map[v1.IPFamily]ProxierHealth{v4: {LastUpdated: t0, Healthy: true}},
		wantLast:    t0,
	}, {
		name:        "pending update younger than the timeout",
		ops:         []op{{updated: v4, step: time.Second}, {queued: v4, step: healthTimeout - time.Nanosecond}},
		wantHealthy: true,
		wantStatus:  map[v1.IPFamily]ProxierHealth{v4: {LastUpdated: t0, Healthy: true}},
		wantLast:    t0,
	}, {
		name:        "pending update as old as the timeout",
		ops:         []op{{updated: v4, step: time.Second}, {queued: v4, step: healthTimeout}},
		wantHealthy: false,
		wantStatus:  map[v1.IPFamily]ProxierHealth{v4: {LastUpdated: t0, Healthy: false}},
		wantLast:    t0,
	}, {
		name: "the oldest pending update counts",
		ops: []op{
			{updated: v4},
			{queued: v4, step: 6 * time.Second},
			{queued: v4, step: 6 * time.Second},
		},
		wantHealthy: false,
		wantStatus:  map[v1.IPFamily]ProxierHealth{v4: {LastUpdated: t0, Healthy: false}},
		wantLast:    t0,
	}, {
		name: "a sync clears the pending update",
		ops: []op{
			{updated: v4},
			{queued: v4, step: time.Minute},
			{updated: v4, step: time.Minute},
		},
		wantHealthy: true,
		wantStatus:  map[v1.IPFamily]ProxierHealth{v4: {LastUpdated: t0.Add(time.Minute), Healthy: true}},
		wantLast:    t0.Add(time.Minute),
	}, {
		name: "dual stack: one stale family makes the proxy unhealthy",
		ops: []op{
			{updated: v4, step: time.Second},
			{updated: v6},
			{queued: v6, step: time.Minute},
			{updated: v4},
		},
		wantHealthy: false,
		wantStatus: map[v1.IPFamily]ProxierHealth{
			v4: {LastUpdated: t0.Add(61 * time.Second), Healthy: true},
			v6: {LastUpdated: t0.Add(time.Second), Healthy: false},
		},
		wantLast: t0.Add(61 * time.Second),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(t0)
			h := NewProxyHealth(healthTimeout, clk)
			apply(clk, h, tc.ops)
			got := h.Health()
			want := HealthStatus{
				LastUpdated: tc.wantLast,
				CurrentTime: clk.Now(),
				Healthy:     tc.wantHealthy,
				Status:      tc.wantStatus,
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Health() (-want +got):\n%s", diff)
			}
			if h.IsHealthy() != tc.wantHealthy {
				t.Errorf("IsHealthy() = %v, want %v", h.IsHealthy(), tc.wantHealthy)
			}
		})
	}
}

func TestSyncNode(t *testing.T) {
	now := metav1.NewTime(t0)
	node := func(edit func(*v1.Node)) *v1.Node {
		n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}
		if edit != nil {
			edit(n)
		}
		return n
	}
	for _, tc := range []struct {
		name string
		node *v1.Node
		want bool
	}{
		{"plain node", node(nil), true},
		{"node gone", nil, false},
		{"node being deleted", node(func(n *v1.Node) { n.DeletionTimestamp = &now }), false},
		{"autoscaler taint", node(func(n *v1.Node) {
			n.Spec.Taints = []v1.Taint{{Key: "other", Effect: v1.TaintEffectNoSchedule}, {Key: ToBeDeletedTaint, Effect: v1.TaintEffectNoSchedule}}
		}), false},
		{"other taints only", node(func(n *v1.Node) {
			n.Spec.Taints = []v1.Taint{{Key: "node.kubernetes.io/unschedulable", Effect: v1.TaintEffectNoSchedule}}
		}), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := NewProxyHealth(healthTimeout, clocktesting.NewFakeClock(t0))
			if h.NodeEligible() {
				t.Fatal("a new ProxyHealth must not be eligible before its Node is seen (upstream: nodeEligible false)")
			}
			// Start from the opposite state to show SyncNode sets both ways.
			if tc.want {
				h.SyncNode(nil)
			} else {
				h.SyncNode(node(nil))
			}
			h.SyncNode(tc.node)
			if got := h.NodeEligible(); got != tc.want {
				t.Errorf("NodeEligible() = %v, want %v", got, tc.want)
			}
		})
	}
}

// startHealthz runs a HealthzServer on 127.0.0.1 and returns its address.
func startHealthz(t *testing.T, h *ProxyHealth) string {
	t.Helper()
	tn := newTestNet()
	s := NewHealthzServer(HealthzServerConfig{BindAddress: "127.0.0.1:10256", Health: h, Listen: tn.listen})
	runServer(t, s.Run)
	return tn.waitListen(t, "127.0.0.1:10256")
}

func TestHealthzAndLivezHTTP(t *testing.T) {
	deleting := metav1.NewTime(t0)
	for _, tc := range []struct {
		name        string
		ops         []op
		node        *v1.Node
		noNode      bool // no Node seen at all (else a plain one)
		wantHealthz int
		wantLivez   int
		wantLast    time.Time // in unhealthy answers; healthy ones say "now"
	}{
		{name: "healthy", ops: []op{{updated: v1.IPv4Protocol, step: time.Minute}}, wantHealthz: 200, wantLivez: 200},
		{name: "stale sync", ops: []op{{updated: v1.IPv4Protocol}, {queued: v1.IPv4Protocol, step: time.Minute}}, wantHealthz: 503, wantLivez: 503, wantLast: t0},
		{name: "node being deleted fails healthz only", ops: []op{{updated: v1.IPv4Protocol}},
			node:        &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", DeletionTimestamp: &deleting}},
			wantHealthz: 503, wantLivez: 200, wantLast: t0},
		// Upstream: nodeEligible false until the Node is seen.
		{name: "node never seen fails healthz only", ops: []op{{updated: v1.IPv4Protocol}}, noNode: true,
			wantHealthz: 503, wantLivez: 200, wantLast: t0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(t0)
			h := NewProxyHealth(healthTimeout, clk)
			apply(clk, h, tc.ops)
			switch {
			case tc.node != nil:
				h.SyncNode(tc.node)
			case !tc.noNode:
				h.SyncNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}})
			}
			addr := startHealthz(t, h)

			for _, ep := range []struct {
				path    string
				healthz bool
				want    int
			}{{"/healthz", true, tc.wantHealthz}, {"/livez", false, tc.wantLivez}} {
				before := counterValue(t, strconv.Itoa(ep.want), ep.healthz)
				resp := get(t, httpURL(addr, ep.path))
				if resp.code != ep.want {
					t.Errorf("%s: code %d, want %d; body %s", ep.path, resp.code, ep.want, resp.body)
				}
				if ct := resp.header.Get("Content-Type"); ct != "application/json" {
					t.Errorf("%s: Content-Type %q", ep.path, ct)
				}
				if got := counterValue(t, strconv.Itoa(ep.want), ep.healthz) - before; got != 1 {
					t.Errorf("%s: counter for code %d grew by %v, want 1", ep.path, ep.want, got)
				}
				var body struct {
					LastUpdated  time.Time `json:"lastUpdated"`
					CurrentTime  time.Time `json:"currentTime"`
					NodeEligible *bool     `json:"nodeEligible"`
					Healthy      *bool     `json:"healthy"`
				}
				if err := json.Unmarshal([]byte(resp.body), &body); err != nil {
					t.Fatalf("%s: body %q: %v", ep.path, resp.body, err)
				}
				if !body.CurrentTime.Equal(clk.Now()) {
					t.Errorf("%s: currentTime %v, want %v", ep.path, body.CurrentTime, clk.Now())
				}
				wantLast := tc.wantLast
				if ep.want == 200 {
					wantLast = clk.Now()
				}
				if !body.LastUpdated.Equal(wantLast) {
					t.Errorf("%s: lastUpdated %v, want %v", ep.path, body.LastUpdated, wantLast)
				}
				if ep.healthz != (body.NodeEligible != nil) {
					t.Errorf("%s: nodeEligible present = %v, want %v", ep.path, body.NodeEligible != nil, ep.healthz)
				}
				if body.Healthy == nil {
					t.Errorf("%s: no healthy field", ep.path)
				}
			}
		})
	}
}

func TestLivezExactBody(t *testing.T) {
	h := NewProxyHealth(healthTimeout, clocktesting.NewFakeClock(t0))
	addr := startHealthz(t, h)
	// Before the Node is seen, as upstream: not eligible, 503 (and, not
	// healthy, the last sync time: none yet).
	want := `{"lastUpdated":"0001-01-01T00:00:00Z","currentTime":"2025-03-01T12:00:00Z","nodeEligible":false,"healthy":true}`
	if got := get(t, httpURL(addr, "/healthz")); got.body != want || got.code != http.StatusServiceUnavailable {
		t.Errorf("no Node yet: %d\n got %s\nwant 503 %s", got.code, got.body, want)
	}
	h.SyncNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}})
	want = `{"lastUpdated":"2025-03-01T12:00:00Z","currentTime":"2025-03-01T12:00:00Z","healthy":true}`
	if got := get(t, httpURL(addr, "/livez")).body; got != want {
		t.Errorf("body\n got %s\nwant %s", got, want)
	}
	want = `{"lastUpdated":"2025-03-01T12:00:00Z","currentTime":"2025-03-01T12:00:00Z","nodeEligible":true,"healthy":true}`
	if got := get(t, httpURL(addr, "/healthz")).body; got != want {
		t.Errorf("body\n got %s\nwant %s", got, want)
	}
	if got := get(t, httpURL(addr, "/other")).code; got != http.StatusNotFound {
		t.Errorf("/other: code %d, want 404", got)
	}
}

func TestHealthzServerBinding(t *testing.T) {
	t.Run("empty address disables", func(t *testing.T) {
		tn := newTestNet()
		s := NewHealthzServer(HealthzServerConfig{BindAddress: "", Health: NewProxyHealth(time.Second, clocktesting.NewFakeClock(t0)), Listen: tn.listen})
		if err := runServer(t, s.Run).wait(t); err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
		if n := tn.attemptsFor(""); n != 0 {
			t.Errorf("listened %d times", n)
		}
	})

	t.Run("hard fail returns the bind error", func(t *testing.T) {
		// Occupy a real port, then ask the server for it.
		busy, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer busy.Close()
		s := NewHealthzServer(HealthzServerConfig{
			BindAddress:         busy.Addr().String(),
			BindAddressHardFail: true,
			Health:              NewProxyHealth(time.Second, clocktesting.NewFakeClock(t0)),
		})
		if err := runServer(t, s.Run).wait(t); !errors.Is(err, syscall.EADDRINUSE) {
			t.Errorf("Run = %v, want EADDRINUSE", err)
		}
	})

	t.Run("soft fail retries every 5s", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(t0)
		tn := newTestNet()
		const addr = "127.0.0.1:10256"
		tn.setFail(addr, errTestListen)
		s := NewHealthzServer(HealthzServerConfig{
			BindAddress: addr,
			Health:      NewProxyHealth(time.Second, clk),
			Listen:      tn.listen,
			Clock:       clk,
		})
		r := runServer(t, s.Run)
		waitForWaiters(t, clk) // first attempt failed, retry timer armed
		if n := tn.attemptsFor(addr); n != 1 {
			t.Fatalf("attempts = %d, want 1", n)
		}
		tn.setFail(addr, nil)
		clk.Step(bindRetryInterval - time.Millisecond)
		if !clk.HasWaiters() || tn.attemptsFor(addr) != 1 {
			t.Fatalf("retried before %v", bindRetryInterval)
		}
		clk.Step(time.Millisecond)
		bound := tn.waitListen(t, addr)
		if got := get(t, httpURL(bound, "/livez")).code; got != http.StatusOK {
			t.Errorf("/livez after retry: %d", got)
		}
		if r.returned() {
			t.Fatalf("Run returned early: %v", r.err)
		}
		if err := r.stop(t); err != nil {
			t.Errorf("Run = %v after cancel, want nil", err)
		}
		// The listener is closed on shutdown.
		if !tn.isClosed(t, addr) {
			t.Error("listener still open after Run returned")
		}
	})
}

// A failed sync: /healthz says so at once, naming the family, even for a
// family that never synced; /livez only after the health timeout; a
// successful sync clears it.
func TestFailedSync(t *testing.T) {
	for _, tc := range []struct {
		name        string
		syncedFirst bool
	}{{"fresh node", false}, {"running node", true}} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(t0)
			h := NewProxyHealth(healthTimeout, clk)
			if tc.syncedFirst {
				h.Updated(v1.IPv4Protocol)
			}
			h.Failed(v1.IPv4Protocol)
			st := h.health(true)
			if st.Healthy || st.Status[v1.IPv4Protocol].Healthy {
				t.Fatalf("healthz after a failed sync: %+v", st)
			}
			if _, ok := st.Status[v1.IPv4Protocol]; !ok {
				t.Fatalf("the failed family is missing from the answer: %+v", st)
			}
			if !h.Health().Healthy {
				t.Fatal("livez unhealthy before the health timeout")
			}
			clk.Step(healthTimeout)
			if h.Health().Healthy {
				t.Fatal("livez healthy although the failure outlasted the health timeout")
			}
			h.Updated(v1.IPv4Protocol)
			if !h.health(true).Healthy || !h.Health().Healthy {
				t.Fatal("still unhealthy after a successful sync")
			}
		})
	}
}
