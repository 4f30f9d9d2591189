package kernel

// The watch every fault case runs through: long-lived streams that echo,
// a prober of new connections and a poller of node-a's /healthz, and the
// "figures:" line that sums them up. Which streams go where, and the
// addresses they use, are in faults_test.go's top comment.

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/testutil/netns"
	"github.com/kproxy/kproxy/internal/testutil/vm"
)

// echoTimeout and connectTimeout bound a stream's echo and a new
// connection. In the emulated test VM (TestMemoryPressure), with kproxy's
// pages being reclaimed and read back over 9p, the whole guest stalls for
// seconds at a time while no rule changes.
var echoTimeout, connectTimeout = func() (time.Duration, time.Duration) {
	if vm.InVM() {
		return 10 * time.Second, 6 * time.Second
	}
	return 3 * time.Second, 2 * time.Second
}()

// watchedStream is a long-lived connection that echoes periodically.
type watchedStream struct {
	name, pod string
	s         *netns.Session
	echoes    int
	err       error
}

// healthObs is one /healthz answer that differed from the one before (code
// 0: no answer).
type healthObs struct {
	at   time.Time
	code int
	body string
}

// faultWatch watches node-a through a fault.
type faultWatch struct {
	t     *testing.T
	c     *kcluster
	start time.Time
	stop  chan struct{}
	wg    sync.WaitGroup

	mu        sync.Mutex
	streams   []*watchedStream
	attempts  int
	failures  int
	failLog   []string
	health    []healthObs
	healthURL string
	// lastPoll is the latest finished poll of /healthz, with when it began.
	lastPoll healthObs
	marks    []string
}

func watchFaults(t *testing.T, c *kcluster) *faultWatch {
	t.Helper()
	w := &faultWatch{t: t, c: c, start: time.Now(), stop: make(chan struct{}),
		healthURL: "http://" + netip.AddrPortFrom(c.Nodes[nodeA].Addr(clientIP), 10256).String() + "/healthz"}
	for _, s := range []struct {
		name string
		from *netns.NS
		dst  netip.AddrPort
		pod  string
	}{
		{"client → web-clusterip (web-a)", c.Client, ap("198.19.0.10:80"), webA},
		{"tester-a → web-clusterip (web-b)", c.Pod(t, testerA).NS, ap("198.19.0.10:80"), webB},
		{"tester-a → dual-stack IPv6", c.Pod(t, testerA).NS, ap("[fd00:19::17]:80"), ""},
	} {
		var sess *netns.Session
		if s.pod != "" {
			sess = openSessionTo(t, s.from, s.dst, s.pod)
		} else {
			var err error
			if sess, err = s.from.OpenSession(s.dst, netns.DialOptions{}); err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
			t.Cleanup(func() { sess.Close() })
			s.pod = sess.Greeting.Server
		}
		w.streams = append(w.streams, &watchedStream{name: s.name, pod: s.pod, s: sess})
	}
	for _, ws := range w.streams {
		w.loop(streamEvery, func(i int) {
			w.mu.Lock()
			broken := ws.err != nil
			w.mu.Unlock()
			if broken {
				return
			}
			msg := fmt.Sprintf("tick-%d", i)
			got, err := ws.s.Echo(msg, echoTimeout)
			w.mu.Lock()
			defer w.mu.Unlock()
			if err == nil && got != ws.pod+" "+msg {
				err = fmt.Errorf("answer %q, want %q", got, ws.pod+" "+msg)
			}
			if err != nil {
				ws.err = fmt.Errorf("after %d echoes, at %v: %w", ws.echoes, w.since(), err)
				return
			}
			ws.echoes++
		})
	}
	tester := c.Pod(t, testerA).NS
	w.loop(probeEvery, func(i int) {
		from, dst := c.Client, ap("198.19.0.10:80")
		if i%2 == 1 {
			from, dst = tester, ap("[fd00:19::17]:80")
		}
		r := from.Request("tcp", dst, netns.DialOptions{Timeout: connectTimeout})
		w.mu.Lock()
		defer w.mu.Unlock()
		w.attempts++
		if r.Outcome != netns.Answered {
			w.failures++
			if len(w.failLog) < 5 {
				w.failLog = append(w.failLog, fmt.Sprintf("%v: %s: %v", w.since(), dst, r))
			}
		}
	})
	w.loop(healthEvery, func(int) {
		w.mu.Lock()
		url := w.healthURL
		w.mu.Unlock()
		began := time.Now()
		code, body, err := c.Client.HTTPGet(url, time.Second)
		if err != nil {
			code, body = 0, err.Error()
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		w.lastPoll = healthObs{at: began, code: code, body: body}
		if n := len(w.health); n == 0 || w.health[n-1].code != code {
			w.health = append(w.health, healthObs{at: time.Now(), code: code, body: body})
		}
	})
	t.Cleanup(w.halt)
	return w
}

// loop runs f every period until the watch stops.
func (w *faultWatch) loop(period time.Duration, f func(i int)) {
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		tick := time.NewTicker(period)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-w.stop:
				return
			case <-tick.C:
				f(i)
			}
		}
	}()
}

func (w *faultWatch) halt() {
	select {
	case <-w.stop:
		return
	default:
	}
	close(w.stop)
	w.wg.Wait()
}

func (w *faultWatch) since() time.Duration { return time.Since(w.start).Round(10 * time.Millisecond) }

// mark notes a moment of the fault for the figures.
func (w *faultWatch) mark(what string) time.Time {
	now := time.Now()
	w.mu.Lock()
	w.marks = append(w.marks, fmt.Sprintf("%s@%v", what, w.since()))
	w.mu.Unlock()
	return now
}

// setHealthURL points the poller at another address (the node's IP changed).
func (w *faultWatch) setHealthURL(u string) {
	w.mu.Lock()
	w.healthURL = u
	w.mu.Unlock()
}

// lastHealth is the latest /healthz answer.
func (w *faultWatch) lastHealth() healthObs {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.health) == 0 {
		return healthObs{}
	}
	return w.health[len(w.health)-1]
}

// healthPolledAfter waits (bounded) for a poll of /healthz that began
// after t and returns its answer: what /healthz said once something
// known at t (kproxy's death) was true. The latest answer alone may come
// from a poll that was under way, or answered, just before.
func (w *faultWatch) healthPolledAfter(t time.Time) healthObs {
	w.t.Helper()
	var h healthObs
	netns.Eventually(w.t, 10*time.Second, "a /healthz poll after "+t.Sub(w.start).Round(10*time.Millisecond).String(), func() (bool, string) {
		w.mu.Lock()
		defer w.mu.Unlock()
		h = w.lastPoll
		return h.at.After(t), "the latest poll began at " + h.at.Sub(w.start).Round(10*time.Millisecond).String()
	})
	return h
}

// waitHealth waits (bounded) until the poller has seen code since, or
// code is the latest answer, and returns when it saw it.
func (w *faultWatch) waitHealth(what string, code int, since time.Time, within time.Duration) time.Time {
	w.t.Helper()
	var at time.Time
	netns.Eventually(w.t, within, fmt.Sprintf("%s: /healthz %d", what, code), func() (bool, string) {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, h := range w.health {
			if h.code == code && !h.at.Before(since) {
				at = h.at
				return true, ""
			}
		}
		if len(w.health) == 0 {
			return false, "no answer yet"
		}
		last := w.health[len(w.health)-1]
		if last.code == code {
			at = time.Now()
			return true, ""
		}
		return false, fmt.Sprintf("last %d %s", last.code, last.body)
	})
	return at
}

// healthNever fails if the poller saw code since.
func (w *faultWatch) healthNever(what string, code int, since time.Time) {
	w.t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, h := range w.health {
		if h.code == code && !h.at.Before(since) {
			w.t.Errorf("%s: /healthz answered %d at %v: %s", what, code, h.at.Sub(w.start).Round(10*time.Millisecond), h.body)
		}
	}
}

// finish stops the watch, checks the streams (each still answers, from its
// pod) and, unless newFailuresOK, that no new connection failed; /healthz
// must end at 200. It logs the case's figures.
func (w *faultWatch) finish(name string, newFailuresOK bool, repair time.Duration) {
	w.t.Helper()
	netns.Eventually(w.t, syncTimeout, "/healthz 200 at the end", func() (bool, string) {
		h := w.lastHealth()
		return h.code == 200, fmt.Sprintf("%d %s", h.code, h.body)
	})
	// Let every stream echo at least once more after the repair.
	time.Sleep(2 * streamEvery)
	w.halt()
	broken, echoes := 0, 0
	for _, s := range w.streams {
		echoes += s.echoes
		if s.err != nil {
			broken++
			w.t.Errorf("stream %s broke: %v", s.name, s.err)
			continue
		}
		checkSession(w.t, "stream "+s.name+" at the end", s.s, s.pod)
	}
	if w.failures > 0 && !newFailuresOK {
		w.t.Errorf("%d of %d new connections failed; first: %v", w.failures, w.attempts, w.failLog)
	}
	var hs []string
	for _, h := range w.health {
		hs = append(hs, fmt.Sprintf("%d@%v", h.code, h.at.Sub(w.start).Round(100*time.Millisecond)))
	}
	rep := "-"
	if repair > 0 {
		rep = repair.Round(10 * time.Millisecond).String()
	}
	w.t.Logf("figures: case=%q streams=%d broken=%d echoes=%d connects=%d failed=%d repair=%s healthz=%s marks=%s",
		name, len(w.streams), broken, echoes, w.attempts, w.failures, rep, strings.Join(hs, ","), strings.Join(w.marks, ","))
	if w.t.Failed() && len(w.failLog) > 0 {
		w.t.Logf("failed connections: %v", w.failLog)
	}
}
