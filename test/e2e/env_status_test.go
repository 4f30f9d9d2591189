package e2e

// kproxy's status as the scenarios read it: /metrics from inside node-a
// (127.0.0.1:10249), the last sync of each IP family, /healthz and /livez
// from the client over the LAN (198.18.0.10:10256, as a load balancer's
// health check would), and values read from the metrics text.

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// metrics fetches kproxy's /metrics from inside node-a.
func (e *env) metrics() (string, error) {
	code, body, err := e.node.HTTPGet("http://"+metricsAddr+"/metrics", 3*time.Second)
	if err == nil && code != 200 {
		err = fmt.Errorf("/metrics: status %d", code)
	}
	return body, err
}

// lastSync is the time of kproxy's last successful sync of an IP family
// (sync_proxy_rules_last_timestamp_seconds), zero before the first.
func (e *env) lastSync(family string) (time.Time, error) {
	m, err := e.metrics()
	if err != nil {
		return time.Time{}, err
	}
	v, ok := metricValue(m, `kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="`+family+`"}`)
	if !ok || v <= 0 {
		return time.Time{}, nil
	}
	return time.Unix(0, int64(v*1e9)), nil
}

// waitFirstSync waits until the current kproxy has synced both families.
func (e *env) waitFirstSync() {
	e.t.Helper()
	e.eventually("kproxy's first sync of both IP families", func() error {
		for _, f := range []string{"IPv4", "IPv6"} {
			t, err := e.lastSync(f)
			if err != nil {
				return err
			}
			if t.IsZero() {
				return fmt.Errorf("no %s sync yet", f)
			}
		}
		return nil
	})
}

// health fetches /healthz or /livez from the client, over the LAN, as a
// load balancer's health check would.
func (e *env) health(path string) (int, healthStatus, error) {
	code, body, err := e.c.Client.HTTPGet(fmt.Sprintf("http://%s%s", ap(nodeAIP, healthzPort), path), 3*time.Second)
	if err != nil {
		return 0, healthStatus{}, err
	}
	var h healthStatus
	if err := json.Unmarshal([]byte(body), &h); err != nil {
		return code, h, fmt.Errorf("%s: not JSON: %v: %s", path, err, body)
	}
	return code, h, nil
}

// healthStatus is the part of upstream's /healthz and /livez JSON the
// tests read.
type healthStatus struct {
	LastUpdated  time.Time `json:"lastUpdated"`
	CurrentTime  time.Time `json:"currentTime"`
	NodeEligible *bool     `json:"nodeEligible"`
	Healthy      *bool     `json:"healthy"`
}

// expectHealth waits until path answers code, with nodeEligible as given
// (nil: not checked).
func (e *env) expectHealth(path string, code int, eligible *bool) {
	e.t.Helper()
	what := fmt.Sprintf("%s answers %d", path, code)
	if eligible != nil {
		what += fmt.Sprintf(" with nodeEligible %v", *eligible)
	}
	e.eventually(what, func() error {
		return e.checkHealth(path, code, eligible)
	})
}

func (e *env) checkHealth(path string, code int, eligible *bool) error {
	got, h, err := e.health(path)
	if err != nil {
		return err
	}
	if got != code {
		return fmt.Errorf("%s: status %d, want %d (%+v)", path, got, code, h)
	}
	if eligible != nil && (h.NodeEligible == nil || *h.NodeEligible != *eligible) {
		return fmt.Errorf("%s: nodeEligible %v, want %v", path, h.NodeEligible, *eligible)
	}
	return nil
}

// metricValue returns the value of one exact series ("name" or
// `name{label="v"}`, labels as the exposition format prints them).
func metricValue(metrics, series string) (float64, bool) {
	for _, line := range strings.Split(metrics, "\n") {
		rest, ok := strings.CutPrefix(line, series+" ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		return v, err == nil
	}
	return 0, false
}

// percentile is the nearest-rank q-quantile (0 < q <= 1) of xs.
func percentile(xs []time.Duration, q float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(float64(len(s))*q+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}
