package framework

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// StopAPIServer stops kube-apiserver (SIGTERM, as the cleanup does) and
// leaves everything else in place: etcd and its data, the certificates, the
// kubeconfigs and the network. Clients get connection errors until
// StartAPIServer brings it back. It returns an error only if the process
// could not be reaped.
func (cp *ControlPlane) StopAPIServer() error {
	return cp.APIServer.Stop()
}

// StartAPIServer runs kube-apiserver again after StopAPIServer, with the
// flags Start gave it, and waits until it is ready (bounded by
// Options.ReadyTimeout). APIServer and APIServerReady then describe the new
// process; its log is kube-apiserver-N.log in Dir (N = 2, 3, …), so the
// first run's log is kept. The new process is stopped in t.Cleanup; t must
// be the test that called Start or one of its subtests, so that it stops
// before etcd does.
func (cp *ControlPlane) StartAPIServer(t testing.TB) {
	t.Helper()
	select {
	case <-cp.APIServer.Done():
	default:
		t.Fatalf("StartAPIServer: %s is still running (StopAPIServer first)", cp.APIServer.Name)
	}
	cp.apiServerRuns++
	name := "kube-apiserver-" + strconv.Itoa(cp.apiServerRuns)
	ctx, cancel := context.WithTimeout(context.Background(), cp.readyTimeout)
	defer cancel()
	start := time.Now()
	cp.APIServer = StartProcess(t, cp.Namespace, cp.Dir, name, cp.apiServerArgv...)
	if err := cp.waitAPIServer(ctx); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	cp.APIServerReady = time.Since(start)
}

// etcdURL is etcd's client URL inside the control plane's namespace.
const etcdURL = "http://127.0.0.1:2379"

// CompactEtcd compacts etcd's history up to its current revision, as the
// API server's periodic compaction (--etcd-compaction-interval) would, and
// returns that revision. A watch that then resumes from an older resource
// version is answered 410 Gone ("too old resource version") if the API
// server serves it from etcd (--watch-cache=false); with the watch cache,
// the cache's own window decides instead.
//
// It speaks etcd's JSON gateway (/v3/kv/...), so the tests need no etcd
// client library.
func (cp *ControlPlane) CompactEtcd(ctx context.Context) (int64, error) {
	client := HTTPClientIn(cp.Namespace)
	// A count-only range over every key returns just the header, which
	// carries the current revision.
	var rng struct {
		Header struct {
			Revision string `json:"revision"`
		} `json:"header"`
	}
	if err := etcdCall(ctx, client, "/v3/kv/range",
		map[string]any{"key": "AA==", "range_end": "AA==", "count_only": true}, &rng); err != nil {
		return 0, fmt.Errorf("reading etcd's revision: %w", err)
	}
	rev, err := strconv.ParseInt(rng.Header.Revision, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("etcd's revision %q: %w", rng.Header.Revision, err)
	}
	// physical: return only once the compaction is applied to the
	// backend, so that nothing older can be read or watched afterwards.
	if err := etcdCall(ctx, client, "/v3/kv/compaction",
		map[string]any{"revision": strconv.FormatInt(rev, 10), "physical": true}, nil); err != nil {
		return 0, fmt.Errorf("compacting etcd at revision %d: %w", rev, err)
	}
	return rev, nil
}

// etcdCall POSTs a JSON request to etcd's gateway and decodes the answer
// into out (unless nil).
func etcdCall(ctx context.Context, client *http.Client, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, etcdURL+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", path, resp.Status, bytes.TrimSpace(b))
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s: %w: %s", path, err, b)
	}
	return nil
}
