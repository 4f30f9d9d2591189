package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestSourceProblem: a source problem makes the proxy unhealthy only once
// it has lasted the health timeout, /healthz then says the source is
// stale, and a good read makes it healthy again at once.
func TestSourceProblem(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	h := NewProxyHealth(healthTimeout, clk)
	h.SyncNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}})
	h.Updated(v1.IPv4Protocol)
	healthz := h.HealthzHandler()
	check := func(what string, wantCode int, want *SourceHealth) {
		t.Helper()
		rec := httptest.NewRecorder()
		healthz.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		var st HealthStatus
		if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
			t.Fatalf("%s: body %q: %v", what, rec.Body, err)
		}
		if rec.Code != wantCode || st.Healthy != (wantCode == http.StatusOK) {
			t.Errorf("%s: code %d healthy %v, want %d", what, rec.Code, st.Healthy, wantCode)
		}
		if diff := cmp.Diff(want, st.Source); diff != "" {
			t.Errorf("%s: source (-want +got):\n%s\nbody %s", what, diff, rec.Body)
		}
	}
	check("good source", http.StatusOK, nil)

	const empty = "empty: /snap/state.yaml: empty file: no document"
	h.SourceProblem(empty)
	clk.Step(healthTimeout / 2)
	check("problem younger than the timeout", http.StatusOK, &SourceHealth{Since: t0, Problem: empty})

	// Another problem while still bad: it counts from the first.
	const garbage = "unparsable: /snap/state.yaml: not an object"
	h.SourceProblem(garbage)
	clk.Step(healthTimeout / 2)
	check("problem as old as the timeout", http.StatusServiceUnavailable, &SourceHealth{Stale: true, Since: t0, Problem: garbage})
	if !h.IsHealthy() {
		t.Error("livez unhealthy with a stale source: a restart cannot repair the file, and kproxy refuses to start without it")
	}

	h.SourceProblem("")
	check("good again", http.StatusOK, nil)

	// A new problem counts from its own start.
	clk.Step(time.Minute)
	h.SourceProblem(empty)
	check("new problem", http.StatusOK, &SourceHealth{Since: t0.Add(healthTimeout + time.Minute), Problem: empty})
}
