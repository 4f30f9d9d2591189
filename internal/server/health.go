// Package server holds kproxy's HTTP servers: the proxy health server
// (/healthz, /livez), the metrics server (/metrics, /proxyMode, /configz,
// /healthz, pprof) and the per-service health check node ports used by load
// balancers for externalTrafficPolicy: Local.
//
// Wire formats follow upstream kube-proxy v1.37 (cmd/kube-proxy/app/server.go
// and pkg/proxy/healthcheck), so probes, load balancers and scrapers written
// for kube-proxy keep working.
package server

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	k8smetrics "k8s.io/component-base/metrics"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kproxy/kproxy/internal/metrics"
)

// ToBeDeletedTaint is the taint the Cluster Autoscaler puts on a node it is
// about to delete. Load balancers should stop sending new connections to
// such a node, so /healthz reports it unhealthy.
const ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// ProxierHealth is the health of the proxier of one IP family.
type ProxierHealth struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// HealthStatus is what /healthz and /livez answer, field for field as
// upstream's ProxyHealth. Times marshal as RFC 3339 with nanoseconds.
type HealthStatus struct {
	// LastUpdated is the most recent successful sync of any IP family. The
	// handlers replace it with CurrentTime when healthy, as upstream does
	// for compatibility with old clients that read it as "loop is alive".
	LastUpdated time.Time `json:"lastUpdated"`
	CurrentTime time.Time `json:"currentTime"`
	// NodeEligible is only set in /healthz answers.
	NodeEligible *bool `json:"nodeEligible,omitempty"`
	// Healthy is true when every IP family's proxier is healthy.
	Healthy bool `json:"healthy"`
	// Status is the health of each IP family that has synced at least once.
	Status map[v1.IPFamily]ProxierHealth `json:"status,omitempty"`
	// Source is set while the source of cluster state reports a problem
	// (kproxy's own field; see ProxyHealth.SourceProblem).
	Source *SourceHealth `json:"source,omitempty"`
}

// SourceHealth is what /healthz says of a failing source of cluster state.
type SourceHealth struct {
	// Stale is true once the problem has lasted the health timeout: the
	// rules may no longer follow the cluster, and the proxy is unhealthy.
	Stale bool `json:"stale"`
	// Since is when the problem began; Problem says what it is.
	Since   time.Time `json:"since"`
	Problem string    `json:"problem"`
}

// ProxyHealth tracks whether the proxy applies the changes it receives in
// time, and whether this node should receive load-balancer traffic.
//
// A proxier is unhealthy when an update was queued (QueuedUpdate) and not
// applied (Updated) within healthTimeout; upstream passes 2 × syncPeriod.
// As upstream, an IP family that has never completed a sync counts as
// starting up and healthy: a long first sync must not get the pod killed
// by a liveness probe on /livez.
type ProxyHealth struct {
	clk           clock.PassiveClock
	healthTimeout time.Duration

	mu sync.RWMutex
	// lastUpdated is the time of the last successful sync per IP family.
	lastUpdated map[v1.IPFamily]time.Time
	// oldestPending is the time of the oldest update queued since the last
	// successful sync, per IP family.
	oldestPending map[v1.IPFamily]time.Time
	// failed holds the families whose last sync failed: their rules are
	// not (all) in place until a sync succeeds.
	failed       map[v1.IPFamily]bool
	nodeEligible bool
	// sourceProblem is the source's current problem ("" when none) and
	// sourceSince when it began.
	sourceProblem string
	sourceSince   time.Time
}

// NewProxyHealth returns a ProxyHealth with the given timeout. clk is the
// source of "now" (a fake clock in tests).
func NewProxyHealth(healthTimeout time.Duration, clk clock.PassiveClock) *ProxyHealth {
	return &ProxyHealth{
		clk:           clk,
		healthTimeout: healthTimeout,
		lastUpdated:   map[v1.IPFamily]time.Time{},
		oldestPending: map[v1.IPFamily]time.Time{},
		failed:        map[v1.IPFamily]bool{},
		// Not eligible until this node's Node object is seen, as upstream
		// (its NodeManager has no Node yet): /healthz answers 503 with
		// nodeEligible false, while the proxy itself runs (/livez).
		nodeEligible: false,
	}
}

// QueuedUpdate records that the proxier of family received a change it has
// not applied yet. Only the oldest pending change counts.
func (h *ProxyHealth) QueuedUpdate(family v1.IPFamily) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, pending := h.oldestPending[family]; !pending {
		h.oldestPending[family] = h.clk.Now()
	}
}

// Updated records that the proxier of family successfully applied all
// changes it had.
func (h *ProxyHealth) Updated(family v1.IPFamily) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.oldestPending, family)
	delete(h.failed, family)
	h.lastUpdated[family] = h.clk.Now()
}

// Failed records that a sync of family failed: its rules are not in place.
// /healthz answers 503 at once, naming the family, until a sync succeeds
// (load balancers should not send traffic to a node whose rules are
// missing); /livez only once the failure outlasts the health timeout, as
// any other change not applied, so a liveness probe does not restart a
// proxy that is about to retry.
func (h *ProxyHealth) Failed(family v1.IPFamily) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failed[family] = true
	if _, pending := h.oldestPending[family]; !pending {
		h.oldestPending[family] = h.clk.Now()
	}
}

// SourceProblem records the state of the source of cluster state after
// each of its reads: problem is "" when the read was good, else one line
// saying what is wrong (the --from-file source keeps the last good objects
// of a broken file, so the rules stay but stop following changes). When a
// problem has lasted the health timeout, the proxy is unhealthy and
// /healthz says the source is stale; a good read makes it healthy again.
func (h *ProxyHealth) SourceProblem(problem string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if problem != "" && h.sourceProblem == "" {
		h.sourceSince = h.clk.Now()
	}
	h.sourceProblem = problem
}

// SyncNode updates node eligibility from this node's Node object. A node
// that is being deleted, tainted ToBeDeletedByClusterAutoscaler, or gone
// (nil) is not eligible for load-balancer traffic.
func (h *ProxyHealth) SyncNode(node *v1.Node) {
	eligible := nodeEligible(node)
	h.mu.Lock()
	defer h.mu.Unlock()
	if eligible != h.nodeEligible {
		klog.InfoS("Node eligibility for load balancer traffic changed", "eligible", eligible)
	}
	h.nodeEligible = eligible
}

func nodeEligible(node *v1.Node) bool {
	if node == nil || !node.DeletionTimestamp.IsZero() {
		return false
	}
	for _, taint := range node.Spec.Taints {
		if taint.Key == ToBeDeletedTaint {
			return false
		}
	}
	return true
}

// NodeEligible reports whether the node should receive load-balancer
// traffic.
func (h *ProxyHealth) NodeEligible() bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.nodeEligible
}

// Health returns the proxy's health, ignoring node eligibility (as /livez).
func (h *ProxyHealth) Health() HealthStatus { return h.health(false) }

// health computes the status; strict (for /healthz) also counts a family
// whose last sync failed as unhealthy at once.
func (h *ProxyHealth) health(strict bool) HealthStatus {
	h.mu.RLock()
	defer h.mu.RUnlock()
	now := h.clk.Now()
	st := HealthStatus{
		CurrentTime: now,
		Healthy:     true,
		Status:      make(map[v1.IPFamily]ProxierHealth, len(h.lastUpdated)),
	}
	for family, last := range h.lastUpdated {
		if last.After(st.LastUpdated) {
			st.LastUpdated = last
		}
		healthy := true
		if queued, pending := h.oldestPending[family]; pending && now.Sub(queued) >= h.healthTimeout {
			healthy = false
			st.Healthy = false
		}
		if strict && h.failed[family] {
			healthy = false
			st.Healthy = false
		}
		st.Status[family] = ProxierHealth{LastUpdated: last, Healthy: healthy}
	}
	// A family that never synced is starting up, unless its sync failed.
	for family := range h.failed {
		if _, ok := h.lastUpdated[family]; ok {
			continue
		}
		healthy := !strict
		if queued, pending := h.oldestPending[family]; pending && now.Sub(queued) >= h.healthTimeout {
			healthy = false
		}
		if !healthy {
			st.Healthy = false
			st.Status[family] = ProxierHealth{Healthy: false}
		}
	}
	// A stale source turns /healthz only: restarting the proxy would not
	// repair the file, and a kproxy that cannot read it at start refuses
	// to start, so /livez must not get it restarted.
	if h.sourceProblem != "" {
		stale := now.Sub(h.sourceSince) >= h.healthTimeout
		st.Source = &SourceHealth{Stale: stale, Since: h.sourceSince, Problem: h.sourceProblem}
		if stale && strict {
			st.Healthy = false
		}
	}
	return st
}

// IsHealthy is Health().Healthy.
func (h *ProxyHealth) IsHealthy() bool {
	return h.Health().Healthy
}

// HealthzHandler answers /healthz: healthy and node eligible → 200, else
// 503. Load balancers for externalTrafficPolicy: Cluster probe this.
func (h *ProxyHealth) HealthzHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		st := h.health(true)
		eligible := h.NodeEligible()
		st.NodeEligible = &eligible
		h.write(w, st, st.Healthy && eligible, metrics.ProxyHealthzTotal)
	})
}

// LivezHandler answers /livez: proxy healthy → 200, else 503. Node
// eligibility does not matter: a node being drained still needs a working
// proxy.
func (h *ProxyHealth) LivezHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		st := h.Health()
		h.write(w, st, st.Healthy, metrics.ProxyLivezTotal)
	})
}

// write sends st as JSON with 200 or 503, counting the answer in counter by
// status code.
func (h *ProxyHealth) write(w http.ResponseWriter, st HealthStatus, healthy bool, counter *k8smetrics.CounterVec) {
	code := http.StatusOK
	if healthy {
		// Upstream compatibility: a healthy answer reports lastUpdated as
		// now, the meaning it had when it was the sync loop's heartbeat.
		st.LastUpdated = h.clk.Now()
	} else {
		code = http.StatusServiceUnavailable
	}
	body, err := json.Marshal(st)
	if err != nil {
		// Cannot happen with these types; answer the status anyway.
		klog.ErrorS(err, "Failed to encode health status")
	}
	counter.WithLabelValues(strconv.Itoa(code)).Inc()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}
