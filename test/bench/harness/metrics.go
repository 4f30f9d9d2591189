package harness

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// Metrics is one scrape of a /metrics page in the Prometheus text format:
// sample name with its labels ("name{a=\"b\"}") → value.
type Metrics map[string]float64

// parseMetrics reads the text format; comments and malformed lines are
// skipped.
func parseMetrics(r io.Reader) (Metrics, error) {
	m := Metrics{}
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		line := s.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		m[line[:i]] = v
	}
	return m, s.Err()
}

// Sum adds every series of name (all label sets).
func (m Metrics) Sum(name string) float64 {
	t := 0.0
	for k, v := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			t += v
		}
	}
	return t
}

// Series maps each label set of name to its value.
func (m Metrics) Series(name string) map[string]float64 {
	out := map[string]float64{}
	for k, v := range m {
		if k == name {
			out[""] = v
		} else if rest, ok := strings.CutPrefix(k, name+"{"); ok {
			out[rest] = v
		}
	}
	return out
}

// scrape reads url with client.
func scrape(ctx context.Context, client *http.Client, url string) (Metrics, error) {
	body, err := get(ctx, client, url)
	if err != nil {
		return nil, err
	}
	defer body.Close()
	return parseMetrics(body)
}

// get is the body of url's answer when it is 200 OK; the caller closes it.
func get(ctx context.Context, client *http.Client, url string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return resp.Body, nil
}

// The metrics both proxies serve.
const (
	mSync         = "kubeproxy_sync_proxy_rules_duration_seconds"
	mSyncFull     = "kubeproxy_sync_full_proxy_rules_duration_seconds"
	mSyncLast     = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
	mNPL          = "kubeproxy_network_programming_duration_seconds"
	mEPChanges    = "kubeproxy_sync_proxy_rules_endpoint_changes_total"
	mSvcChanges   = "kubeproxy_sync_proxy_rules_service_changes_total"
	mHeapInuse    = "go_memstats_heap_inuse_bytes"
	mHeapAlloc    = "go_memstats_heap_alloc_bytes"
	metricsListen = "127.0.0.1:10249"
	healthzListen = "127.0.0.1:10256"
	metricsURL    = "http://" + metricsListen + "/metrics"
)
