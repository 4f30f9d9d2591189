package e2e

// Disruptions: the API server goes away for a minute, kproxy is killed and
// restarted, and kproxy's watches expire (410 Gone). They stop, restart
// and compact the package's shared control plane in place (same etcd,
// certificates and address); its cleanup leaves the API server running
// with its own flags again for the next test. Addresses: see env_test.go.

import (
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/internal/testutil/netns"
)

const (
	// apiOutage is how long the API server stays down: longer than
	// kproxy's health timeout would allow a stuck update (2 × syncPeriod
	// = 60 s) and than one periodic sync interval (30 s).
	apiOutage = 60 * time.Second
	// syncPeriod is kproxy's default full sync period (nftables and
	// iptables syncPeriod).
	syncPeriod = 30 * time.Second
	// outageCheckEvery spaces the checks made during the outage.
	outageCheckEvery = 5 * time.Second
	// apiResyncTimeout bounds how long kproxy may take to notice that the
	// API server is back: client-go's reflectors wait between failed
	// watches up to 30 s plus as much again of random jitter, so after a
	// minute-long outage that is up to a minute. Upstream kube-proxy, with
	// the same client-go, is no faster.
	apiResyncTimeout = 2 * time.Minute
)

func TestDisruption(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			for _, d := range []struct {
				name string
				run  func(t *testing.T, mode modeCase)
			}{
				{"api-server-outage", disruptionAPIServerOutage},
				{"kproxy-sigkill", disruptionKproxyKilled},
				{"watch-expired", disruptionWatchExpired},
			} {
				t.Run(d.name, func(t *testing.T) {
					start := time.Now()
					d.run(t, mode)
					t.Logf("%s in %s mode: %s", d.name, mode.name, time.Since(start).Round(time.Millisecond))
				})
			}
		})
	}
}

// session is a long-lived TCP connection through the service.
type session struct {
	from string
	s    *netns.Session
}

// openSession opens a long-lived connection from `from` to dst; it is
// closed at the end of the test.
func (e *env) openSession(from string, dst netip.AddrPort) *session {
	e.t.Helper()
	s, err := e.ns(from).OpenSession(dst, netns.DialOptions{Timeout: 2 * time.Second})
	if err != nil {
		e.t.Fatalf("long-lived connection from %s to %s: %v", from, dst, err)
	}
	e.t.Cleanup(func() { s.Close() })
	return &session{from: from, s: s}
}

// check says whether the connection still carries data both ways, to the
// pod it reached first.
func (s *session) check() error {
	msg := fmt.Sprintf("still-there-%d", time.Now().UnixNano())
	pod := s.s.Greeting.Server
	got, err := s.s.Echo(msg, 2*time.Second)
	if err != nil || got != pod+" "+msg {
		return fmt.Errorf("established connection from %s to %s: echo %q = %q, %v", s.from, pod, msg, got, err)
	}
	return nil
}

// disruptionAPIServerOutage: the API server is stopped for apiOutage.
// Meanwhile the rules stay, established and new connections work, and
// kproxy's health stays truthful: it has nothing queued that it failed to
// apply (no update can arrive without the API server) and it keeps syncing
// on its period, so /healthz answers 200 as upstream's does. After the API
// server returns, kproxy's watches resume and a change made right away is
// programmed.
func disruptionAPIServerOutage(t *testing.T, mode modeCase) {
	cp := sharedControlPlane(t)
	// The reflector logs failed watches at level 4.
	e := newEnv(t, cp, mode, "--vmodule=reflector=4")
	svc := e.createService("web", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort })
	cip, np := ap(clusterIP(svc, v4), 80), ap(nodeAIP, nodePort(svc, "tcp"))
	e.setEndpoints("web", ipv4, endpoint{pod: podA1}, endpoint{pod: podB1})
	both := []string{podA1, podB1}
	e.expectServers(client, "tcp", cip, both...)
	e.expectServers(client, "tcp", np, both...)
	sessions := []*session{e.openSession(client, cip), e.openSession(testerA, cip)}
	e.expectHealth("/healthz", http.StatusOK, ptr.To(true))
	// The API server deregisters itself from the "kubernetes" Service as
	// it shuts down, which kproxy rightly follows: every other service
	// must stay as it is.
	kubernetesKey := serviceKey("198.19.0.1", corev1.ProtocolTCP, 443)
	before, err := mode.captured(e.node.Name)
	if err != nil {
		t.Fatal(err)
	}
	before = slices.DeleteFunc(before, func(k string) bool { return k == kubernetesKey })
	for _, k := range []string{serviceKey(cip.Addr().String(), corev1.ProtocolTCP, 80), nodePortKey("ip", corev1.ProtocolTCP, int32(np.Port()))} {
		if !slices.Contains(before, k) {
			t.Fatalf("rules capture %v, without %s", before, k)
		}
	}
	logBefore := len(e.kproxyLog())

	stopping := time.Now()
	if err := cp.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	t.Logf("API server stopped in %s", stopped.Sub(stopping).Round(time.Millisecond))
	checks := 0
	for next := stopped; time.Since(stopped) < apiOutage; next = next.Add(outageCheckEvery) {
		time.Sleep(time.Until(next))
		e.alive()
		at := time.Since(stopped).Round(time.Second)
		for _, s := range sessions {
			if err := s.check(); err != nil {
				t.Errorf("%s into the outage: %v", at, err)
			}
		}
		got, err := mode.captured(e.node.Name)
		if got = slices.DeleteFunc(got, func(k string) bool { return k == kubernetesKey }); err != nil || !slices.Equal(got, before) {
			t.Errorf("%s into the outage: rules capture %v (%v), before %v (the kubernetes Service left aside)", at, got, err, before)
		}
		for _, dst := range []netip.AddrPort{cip, np} {
			if err := serversOnce(e.c.Client, "tcp", dst, both, anyPeer); err != nil {
				t.Errorf("%s into the outage: %v", at, err)
			}
		}
		if err := e.checkHealth("/healthz", http.StatusOK, ptr.To(true)); err != nil {
			t.Errorf("%s into the outage: %v", at, err)
		}
		if err := e.checkHealth("/livez", http.StatusOK, nil); err != nil {
			t.Errorf("%s into the outage: %v", at, err)
		}
		checks++
	}
	if t.Failed() {
		t.FailNow()
	}
	// kproxy did lose the API server (so the checks above tested
	// something), and its sync loop kept running: a periodic sync
	// happened during the outage.
	if log := e.kproxyLog(); !strings.Contains(log[min(logBefore, len(log)):], "Watch failed") {
		t.Errorf("kproxy's log does not show it failing to reach the API server during the outage")
	}
	last, err := e.lastSync("IPv4")
	if err != nil {
		t.Fatal(err)
	}
	if ago := time.Since(last); !last.After(stopped) || ago > syncPeriod+5*time.Second {
		t.Errorf("kproxy's last sync was %s ago, %s into the outage: its periodic sync (every %s) stopped", ago.Round(time.Millisecond), last.Sub(stopped).Round(time.Millisecond), syncPeriod)
	}
	t.Logf("API server down for %s; %d rounds of checks passed; kproxy synced at %s into the outage",
		time.Since(stopped).Round(time.Second), checks, last.Sub(stopped).Round(time.Millisecond))

	cp.StartAPIServer(t)
	back := time.Now()
	// A change right away: b1 leaves web, a new Service appears.
	e.setEndpoints("web", ipv4, endpoint{pod: podA1})
	after := e.createService("after")
	e.setEndpoints("after", ipv4, endpoint{pod: podA2})
	afterIP := ap(clusterIP(after, v4), 80)
	e.eventuallyWithin(apiResyncTimeout, "the change made after the restart is programmed", func() error {
		if err := serversOnce(e.c.Client, "tcp", cip, []string{podA1}, anyPeer); err != nil {
			return err
		}
		return serversOnce(e.c.Client, "tcp", afterIP, []string{podA2}, anyPeer)
	})
	// The API server registered itself again.
	e.expectCaptured(true, kubernetesKey)
	t.Logf("API server ready %s after its restart; a change made then was programmed %s later (client-go's watch back-off)",
		cp.APIServerReady.Round(time.Millisecond), time.Since(back).Round(time.Millisecond))
	for _, s := range sessions {
		if err := s.check(); err != nil {
			t.Errorf("after the outage: %v", err)
		}
	}
	e.expectHealth("/healthz", http.StatusOK, ptr.To(true))
}

// disruptionKproxyKilled: kproxy is SIGKILLed and restarted. Its rules are
// not flushed, neither by the crash nor by the restart (the tables are the
// same kernel objects, and new connections to an unchanged service never
// fail); established connections survive; and the first sync after the
// restart is already correct for changes made while kproxy was down.
func disruptionKproxyKilled(t *testing.T, mode modeCase) {
	cp := sharedControlPlane(t)
	e := newEnv(t, cp, mode)
	stable := ap(clusterIP(e.createService("stable"), v4), 80)
	changing := ap(clusterIP(e.createService("changing"), v4), 80)
	doomed := ap(clusterIP(e.createService("doomed"), v4), 80)
	e.setEndpoints("stable", ipv4, endpoint{pod: podA1}, endpoint{pod: podB1})
	e.setEndpoints("changing", ipv4, endpoint{pod: podA1})
	e.setEndpoints("doomed", ipv4, endpoint{pod: podA2})
	both := []string{podA1, podB1}
	e.expectServers(client, "tcp", stable, both...)
	e.expectServers(client, "tcp", changing, podA1)
	e.expectServers(client, "tcp", doomed, podA2)
	sessions := []*session{e.openSession(client, stable), e.openSession(testerA, stable)}
	before, err := mode.captured(e.node.Name)
	if err != nil {
		t.Fatal(err)
	}
	var id0 string
	if mode.identity != nil {
		if id0, err = mode.identity(e.node.Name); err != nil {
			t.Fatal(err)
		}
	}

	// New connections to the unchanged service, all along: a flush of the
	// rules at any moment would make some fail.
	prober := startProber(e.c.Client, stable, both)
	defer prober.stop()

	e.killKproxy()
	killed := time.Now()
	if got, err := mode.captured(e.node.Name); err != nil || !slices.Equal(got, before) {
		t.Errorf("after SIGKILL: rules capture %v (%v), before %v", got, err, before)
	}
	for _, s := range sessions {
		if err := s.check(); err != nil {
			t.Errorf("while kproxy is down: %v", err)
		}
	}
	// Changes kproxy misses while down.
	e.setEndpoints("changing", ipv4, endpoint{pod: podA2})
	e.deleteService("doomed")
	born := ap(clusterIP(e.createService("born"), v4), 80)
	e.setEndpoints("born", ipv4, endpoint{pod: podB1})

	e.startKproxy()
	restarted := time.Now()
	e.waitFirstSync()
	t.Logf("kproxy down for %s; first sync %s after the restart", restarted.Sub(killed).Round(time.Millisecond), time.Since(restarted).Round(time.Millisecond))

	// The first sync is correct: checked at once, no waiting for later
	// syncs.
	got, err := mode.captured(e.node.Name)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []netip.AddrPort{stable, changing, born} {
		if k := serviceKey(want.Addr().String(), corev1.ProtocolTCP, 80); !slices.Contains(got, k) {
			t.Errorf("first sync after the restart: %s not captured: %v", k, got)
		}
	}
	if k := serviceKey(doomed.Addr().String(), corev1.ProtocolTCP, 80); slices.Contains(got, k) {
		t.Errorf("first sync after the restart: the deleted Service's %s still captured", k)
	}
	for _, c := range []struct {
		dst  netip.AddrPort
		want []string
	}{{stable, both}, {changing, []string{podA2}}, {born, []string{podB1}}} {
		if err := serversOnce(e.c.Client, "tcp", c.dst, c.want, anyPeer); err != nil {
			t.Errorf("first sync after the restart: %v", err)
		}
	}
	if r := request(e.c.Client, "tcp", doomed); r.Outcome == netns.Answered {
		t.Errorf("first sync after the restart: the deleted Service's %s answered: %v", doomed, r)
	}

	n, failures := prober.stop()
	if n == 0 || len(failures) > 0 {
		t.Errorf("new connections to the unchanged service during the kill and restart: %d of %d failed: %v", len(failures), n, failures)
	} else {
		t.Logf("%d new connections to the unchanged service during the kill and restart, all answered", n)
	}
	for _, s := range sessions {
		if err := s.check(); err != nil {
			t.Errorf("after the restart: %v", err)
		}
	}
	if mode.identity != nil {
		if id1, err := mode.identity(e.node.Name); err != nil || id1 != id0 {
			t.Errorf("rules re-created by the restart: identity %q (%v), before %q", id1, err, id0)
		}
	}
}

// prober opens new connections to a service in a loop and records those not
// answered by one of the expected servers.
type prober struct {
	done     chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	n        int
	failures []string
	stopped  bool
}

func startProber(from *netns.NS, dst netip.AddrPort, want []string) *prober {
	p := &prober{done: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			select {
			case <-p.done:
				return
			case <-time.After(20 * time.Millisecond):
			}
			r := request(from, "tcp", dst)
			p.mu.Lock()
			p.n++
			if r.Outcome != netns.Answered || !slices.Contains(want, r.Server) {
				p.failures = append(p.failures, fmt.Sprintf("%s: %v", time.Now().Format("15:04:05.000"), r))
			}
			p.mu.Unlock()
		}
	}()
	return p
}

// stop ends the loop (once) and returns the count of probes and failures.
func (p *prober) stop() (int, []string) {
	p.mu.Lock()
	if !p.stopped {
		p.stopped = true
		close(p.done)
	}
	p.mu.Unlock()
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n, p.failures
}

// disruptionWatchExpired: kproxy's watches expire while it is cut off, and
// it recovers by listing again. The API server serves watches from etcd
// (--watch-cache=false), so a watch resuming from a resource version that
// etcd compacted away is answered 410 Gone.
//
// The API server is stopped (which ends every watch), kproxy frozen
// (SIGSTOP), the API server started again, objects changed and etcd
// compacted past them; thawed (SIGCONT), kproxy's reflectors resume their
// watches from their last resource version, get 410 Gone and relist. The
// rules must then show the changes.
func disruptionWatchExpired(t *testing.T, mode modeCase) {
	cp := sharedControlPlane(t)
	cp.WithAPIServerArgs(t, "--watch-cache=false")
	// The reflector logs a watch closed by 410 Gone at level 4.
	e := newEnv(t, cp, mode, "--vmodule=reflector=4")
	web := ap(clusterIP(e.createService("web"), v4), 80)
	e.setEndpoints("web", ipv4, endpoint{pod: podA1})
	e.expectServers(client, "tcp", web, podA1)

	// Stopping the API server ends kproxy's watches; kproxy's reflectors
	// keep retrying them from their last resource version.
	if err := cp.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	if err := e.kproxy.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// Deferred, so that it runs before any cleanup: a frozen kproxy would
	// not act on the SIGTERM its cleanup sends.
	defer e.kproxy.Signal(syscall.SIGCONT)
	cp.StartAPIServer(t)
	e.setEndpoints("web", ipv4, endpoint{pod: podA2})
	late := ap(clusterIP(e.createService("late"), v4), 80)
	e.setEndpoints("late", ipv4, endpoint{pod: podB1})
	rev, err := cp.CompactEtcd(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	logBefore := len(e.kproxyLog())
	if err := e.kproxy.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	thawed := time.Now()
	e.expectServers(client, "tcp", web, podA2)
	e.expectServers(client, "tcp", late, podB1)
	t.Logf("etcd compacted at revision %d; kproxy programmed the changes it missed %s after it was thawed",
		rev, time.Since(thawed).Round(time.Millisecond))

	// It got there by a 410 Gone and a new list, not by a watch that
	// happened to still work.
	var log string
	e.eventually("kproxy's log shows an expired watch and a new list", func() error {
		log = e.kproxyLog()
		log = log[min(logBefore, len(log)):]
		if !strings.Contains(log, "too old") {
			return fmt.Errorf("no %q in kproxy's log since it was thawed", "too old")
		}
		if !strings.Contains(log, "Caches populated") {
			return fmt.Errorf("no %q in kproxy's log since it was thawed", "Caches populated")
		}
		return nil
	})
	e.expectHealth("/healthz", http.StatusOK, ptr.To(true))
}
