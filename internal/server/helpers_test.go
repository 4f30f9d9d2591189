package server

// Test addresses: every server under test listens on loopback.
//
//	127.0.0.1, 127.0.0.2  node IPs of the service health check tests
//	                      (Linux routes all of 127.0.0.0/8 to lo)
//	port 0                the kernel picks a free port; testNet maps the port a
//	                      server asks for to the one it got
//
// Requests are real HTTP over TCP; no part of net/http is mocked.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/utils/clock"

	"github.com/kproxy/kproxy/internal/metrics"
)

const waitTimeout = 10 * time.Second

// testNet is a ListenFunc that binds the requested host on a kernel-chosen
// port and remembers the mapping, so that tests can ask for fixed ports
// (health check node ports) without colliding with anything on the machine.
type testNet struct {
	mu       sync.Mutex
	fail     map[string]error            // requested address → error to return
	bound    map[string]*trackedListener // requested address → latest listener
	attempts map[string]int
	listened chan string // requested addresses, in order of successful binds
}

func newTestNet() *testNet {
	return &testNet{
		fail:     map[string]error{},
		bound:    map[string]*trackedListener{},
		attempts: map[string]int{},
		listened: make(chan string, 100),
	}
}

type trackedListener struct {
	net.Listener
	mu     sync.Mutex
	closed bool
}

func (l *trackedListener) Close() error {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	return l.Listener.Close()
}

func (l *trackedListener) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

func (n *testNet) setFail(addr string, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err == nil {
		delete(n.fail, addr)
	} else {
		n.fail[addr] = err
	}
}

func (n *testNet) listen(ctx context.Context, network, addr string) (net.Listener, error) {
	n.mu.Lock()
	n.attempts[addr]++
	err := n.fail[addr]
	n.mu.Unlock()
	if err != nil {
		return nil, err
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if host == "" {
		host = "127.0.0.1"
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, network, net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, err
	}
	tl := &trackedListener{Listener: ln}
	n.mu.Lock()
	n.bound[addr] = tl
	n.mu.Unlock()
	n.listened <- addr
	return tl, nil
}

func (n *testNet) attemptsFor(addr string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.attempts[addr]
}

// actual returns the real address the server that asked for addr got.
func (n *testNet) actual(t *testing.T, addr string) string {
	t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	l, ok := n.bound[addr]
	if !ok {
		t.Fatalf("nothing listened on %s", addr)
	}
	return l.Addr().String()
}

func (n *testNet) isClosed(t *testing.T, addr string) bool {
	t.Helper()
	n.mu.Lock()
	l, ok := n.bound[addr]
	n.mu.Unlock()
	if !ok {
		t.Fatalf("nothing listened on %s", addr)
	}
	return l.isClosed()
}

// waitListen waits until a server bound addr.
func (n *testNet) waitListen(t *testing.T, addr string) string {
	t.Helper()
	timeout := time.After(waitTimeout)
	for {
		select {
		case a := <-n.listened:
			if a == addr {
				return n.actual(t, addr)
			}
		case <-timeout:
			t.Fatalf("timed out waiting for a listener on %s", addr)
		}
	}
}

var client = &http.Client{
	Timeout:   waitTimeout,
	Transport: &http.Transport{DisableKeepAlives: true},
}

type response struct {
	code   int
	header http.Header
	body   string
}

func do(t *testing.T, method, url string, body io.Reader) response {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading %s: %v", url, err)
	}
	return response{code: resp.StatusCode, header: resp.Header, body: string(b)}
}

func get(t *testing.T, url string) response {
	t.Helper()
	return do(t, http.MethodGet, url, nil)
}

// running is a Run call in the background.
type running struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned
	err    error         // Run's result, valid after done
}

// runServer calls run in the background; the test's cleanup stops it.
func runServer(t *testing.T, run func(context.Context) error) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = run(ctx)
	}()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// wait waits for Run to return by itself and returns its result.
func (r *running) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-r.done:
		return r.err
	case <-time.After(waitTimeout):
		t.Fatal("Run did not return")
		return nil
	}
}

// returned reports whether Run has returned.
func (r *running) returned() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// stop cancels Run's context and returns its result.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	return r.wait(t)
}

// waitForWaiters waits until something waits on the fake clock, i.e. the
// server armed its retry timer, so that stepping the clock cannot race it.
func waitForWaiters(t *testing.T, clk interface{ HasWaiters() bool }) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !clk.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for a timer on the fake clock")
		}
		time.Sleep(time.Millisecond)
	}
}

func counterValue(t *testing.T, code string, healthz bool) float64 {
	t.Helper()
	if healthz {
		return testutil.ToFloat64(metrics.ProxyHealthzTotal.WithLabelValues(code).(prometheus.Counter))
	}
	return testutil.ToFloat64(metrics.ProxyLivezTotal.WithLabelValues(code).(prometheus.Counter))
}

var errTestListen = errors.New("test: address in use")

var _ clock.WithTicker = clock.RealClock{}

func httpURL(addr, path string) string {
	return fmt.Sprintf("http://%s%s", addr, path)
}
