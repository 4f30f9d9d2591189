package framework

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
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
// flags it last ran with (Start's, or WithAPIServerArgs's during that
// call's test), and waits until it is ready (bounded by
// Options.ReadyTimeout). APIServer and APIServerReady then describe the new
// process; its log is kube-apiserver-N.log in Dir (N = 2, 3, …), so the
// first run's log is kept. The new process belongs to the control plane,
// not to t: it is stopped with the control plane, before etcd.
func (cp *ControlPlane) StartAPIServer(t testing.TB) {
	t.Helper()
	if err := cp.startAPIServer(); err != nil {
		t.Fatalf("StartAPIServer: %v", err)
	}
}

// startAPIServer is StartAPIServer returning an error.
func (cp *ControlPlane) startAPIServer() error {
	select {
	case <-cp.APIServer.Done():
	default:
		return fmt.Errorf("%s is still running (StopAPIServer first)", cp.APIServer.Name)
	}
	cp.apiServerRuns++
	name := "kube-apiserver-" + strconv.Itoa(cp.apiServerRuns)
	ctx, cancel := context.WithTimeout(context.Background(), cp.readyTimeout)
	defer cancel()
	start := time.Now()
	p, err := startProcess(cp.owner, cp.Namespace, cp.Dir, name, cp.apiServerArgv...)
	if err != nil {
		return err
	}
	cp.APIServer = p
	if err := cp.waitAPIServer(ctx); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	cp.APIServerReady = time.Since(start)
	return nil
}

// WithAPIServerArgs restarts kube-apiserver (same etcd, certificates,
// address and kubeconfigs) with args added after Start's flags (a repeated
// flag takes the later value), for the rest of t; in t.Cleanup it is
// restarted with Start's flags again, so that the next test of a shared
// control plane finds it as it was. Between the two, StopAPIServer and
// StartAPIServer keep args.
func (cp *ControlPlane) WithAPIServerArgs(t testing.TB, args ...string) {
	t.Helper()
	if err := cp.restartAPIServer(append(slices.Clone(cp.baseAPIServerArgv), args...)); err != nil {
		t.Fatalf("restarting kube-apiserver with %v: %v", args, err)
	}
	t.Cleanup(func() {
		if err := cp.restoreAPIServer(); err != nil {
			t.Errorf("restarting kube-apiserver with its own flags: %v", err)
		}
	})
}

// restoreAPIServer makes sure kube-apiserver runs with Start's flags:
// restarted if a test left it with others, started if a test left it
// stopped (a disruption test that failed during its outage).
func (cp *ControlPlane) restoreAPIServer() error {
	if !slices.Equal(cp.apiServerArgv, cp.baseAPIServerArgv) {
		return cp.restartAPIServer(cp.baseAPIServerArgv)
	}
	select {
	case <-cp.APIServer.Done():
		return cp.startAPIServer()
	default:
		return nil
	}
}

// restartAPIServer stops kube-apiserver (if running) and runs it with argv.
func (cp *ControlPlane) restartAPIServer(argv []string) error {
	if err := cp.StopAPIServer(); err != nil {
		return err
	}
	cp.apiServerArgv = argv
	return cp.startAPIServer()
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
