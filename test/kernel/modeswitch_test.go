package kernel

// Mode switches and restarts under traffic. kproxy runs on node-a in one
// mode; it is stopped (SIGTERM: its rules stay, as kube-proxy's do) and
// started again in another mode (or the same one: a restart). Meanwhile
// long-lived TCP streams echo a line every 50 ms, and probers open a new
// TCP connection every 20 ms; no connection may fail, no stream may
// break, and at the end only the new mode's rules may remain.
//
// Addresses are the example's (cluster_test.go); the services used:
//
//   198.19.0.10:80     web-clusterip, pods web-a (node-a) and web-b (node-b)
//   198.18.0.10:30080  web-nodeport on node-a, the same pods
//   [fd00:19::17]:80   dual-stack's IPv6 ClusterIP, pods dual-a and dual-b

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// Intervals of the traffic watched across a switch.
const (
	probeEvery  = 20 * time.Millisecond
	streamEvery = 50 * time.Millisecond
	// lostSYN: a new connection that takes this long had its SYN
	// dropped and retransmitted (after 1 s): a window without rules,
	// even though the connection succeeded in the end. Between
	// namespaces a connection takes well under a millisecond.
	lostSYN = 900 * time.Millisecond
	// afterSwitch keeps the traffic going after the old rules are gone.
	afterSwitch = time.Second
	// switchTraffic bounds how long the probers and streams run at most.
	switchTraffic = 3 * time.Minute
)

// TestModeSwitch: restarting kproxy in another mode (or the same) breaks
// nothing. The new mode's rules are in place (first sync of both
// families) before the old mode's are removed.
func TestModeSwitch(t *testing.T) {
	t.Parallel()
	nft := nftablesMode
	legacy, nftBackend := iptablesMode(xtables.Legacy), iptablesMode(xtables.NFT)
	for _, tc := range []struct{ from, to proxyMode }{
		{legacy, nft},
		{nftBackend, nft},
		{nft, legacy},
		{nft, nftBackend},
		{legacy, nftBackend},
		{nftBackend, legacy},
		// Restarts with unchanged state.
		{nft, nft},
		{legacy, legacy},
		{nftBackend, nftBackend},
	} {
		t.Run(tc.from.name+"-to-"+tc.to.name, func(t *testing.T) {
			t.Parallel()
			for _, m := range []proxyMode{tc.from, tc.to} {
				for _, bin := range m.needs {
					netns.Require(t, bin)
				}
			}
			testModeSwitch(t, tc.from, tc.to)
		})
	}
}

func testModeSwitch(t *testing.T, from, to proxyMode) {
	c := newCluster(t, clusterOptions{mode: from, kproxyOn: []string{nodeA}})
	node := c.Nodes[nodeA].NS
	if err := otherModesLeft(node, from); err != nil {
		t.Fatalf("before the switch: %v", err)
	}
	tester := c.Pod(t, testerA)
	streams := []*stream{
		startStream(t, c.Client, "client to web-clusterip", ap("198.19.0.10:80"), web),
		startStream(t, tester.NS, "pod to web-clusterip", ap("198.19.0.10:80"), web),
		startStream(t, c.Client, "client to web-nodeport", ap("198.18.0.10:30080"), web),
		startStream(t, tester.NS, "pod to dual-stack over IPv6", ap("[fd00:19::17]:80"), dual),
	}
	probers := []*connProber{
		startConnProber(c.Client, "client to web-clusterip", ap("198.19.0.10:80"), web, false),
		startConnProber(tester.NS, "pod to web-clusterip", ap("198.19.0.10:80"), web, true),
		startConnProber(tester.NS, "pod to dual-stack over IPv6", ap("[fd00:19::17]:80"), dual, true),
	}
	stopAll := func() {
		for _, p := range probers {
			p.stop()
		}
		for _, s := range streams {
			s.stop()
		}
	}
	defer stopAll()
	// Some traffic through the old rules first.
	time.Sleep(200 * time.Millisecond)

	if err := c.kproxy[nodeA].Stop(); err != nil {
		t.Fatal(err)
	}
	c.mode = to
	start := time.Now()
	c.restartKproxy(nodeA)
	synced := time.Since(start)

	// The old mode's rules go after the first sync; wait for that (and
	// for nothing in the restart cases).
	err := netns.Poll(syncTimeout, func() (bool, string) {
		if err := otherModesLeft(node, to); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	if err != nil {
		t.Errorf("the old mode's rules were not removed: %v", err)
	}
	gone := time.Since(start)
	time.Sleep(afterSwitch)
	stopAll()

	// The new mode's rules, once, and routing to both web pods.
	d, err := to.dump(node)
	if err != nil {
		t.Fatal(err)
	}
	if err := to.definedOnce(d); err != nil {
		t.Errorf("after the switch: %v", err)
	}
	for _, pod := range web {
		if !to.routesTo(d, "demo/web-clusterip/tcp/http", c.Pod(t, pod).IP(clientIP)) {
			t.Errorf("after the switch the %s rules do not route web-clusterip to %s", to.name, pod)
		}
	}
	// The log says the removal came after the first sync of both families.
	log := c.kproxy[nodeA].Log()
	run := log[strings.LastIndex(log, "==== "):]
	removed := strings.Index(run, oldModesRemovedLine)
	for _, fam := range []string{"IPv4", "IPv6"} {
		if i := strings.Index(run, `"Synced" ipFamily="`+fam+`"`); i < 0 || removed < 0 || i > removed {
			t.Errorf("kproxy's log does not show the first %s sync (at %d) before the removal of the old rules (at %d)", fam, i, removed)
		}
	}

	attempted, failed := 0, 0
	for _, p := range probers {
		n, failures := p.result()
		attempted += n
		failed += len(failures)
		if n == 0 {
			t.Errorf("prober %s made no connection", p.name)
		}
		for i, f := range failures {
			if i == 10 {
				t.Errorf("prober %s: and %d more failures", p.name, len(failures)-10)
				break
			}
			t.Errorf("prober %s: %s", p.name, f)
		}
	}
	echoes, broken := 0, 0
	for _, s := range streams {
		n, err := s.result()
		echoes += n
		if err != nil {
			broken++
			t.Errorf("stream %s broke after %d echoes: %v", s.name, n, err)
		}
	}
	t.Logf("switch %s -> %s: connections attempted %d, failed %d; streams held %d of %d (%d echoes), broken %d; first sync %v and old rules gone %v after the start",
		from.name, to.name, attempted, failed, len(streams)-broken, len(streams), echoes, broken,
		synced.Round(time.Millisecond), gone.Round(time.Millisecond))
}

// otherModesLeft reports the kube-proxy rules on the node that do not
// belong to mode m: nftables mode's tables (kube-proxy and its shards) in
// either family, and kube-proxy's iptables chains in each backend and
// family but m's own. The kubelet's chains (KUBE-FIREWALL,
// KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT, KUBE-MARK-DROP) are not
// kube-proxy's: they stay. The names are read here, not with kproxy's own
// leftover code.
func otherModesLeft(n *netns.NS, m proxyMode) error {
	var left []string
	if m.iptables {
		for _, fam := range []string{"ip", "ip6"} {
			out, err := n.Exec(10*time.Second, "nft", "list", "tables", fam)
			if err != nil {
				return fmt.Errorf("nft list tables %s: %v", fam, err)
			}
			for _, l := range strings.Split(out, "\n") {
				if name, ok := strings.CutPrefix(strings.TrimSpace(l), "table "+fam+" "); ok && strings.HasPrefix(name, "kube-proxy") {
					left = append(left, "nftables "+fam+" "+name)
				}
			}
		}
	}
	kubelet := []string{"KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT", "KUBE-MARK-DROP"}
	for _, b := range []xtables.Backend{xtables.Legacy, xtables.NFT} {
		if m.iptables && slices.Contains(m.env, xtables.EnvMode+"="+string(b)) {
			continue
		}
		for _, bin := range []string{"iptables-" + string(b) + "-save", "ip6tables-" + string(b) + "-save"} {
			if netns.Missing(bin) != "" {
				continue
			}
			out, err := n.Exec(10*time.Second, bin)
			if err != nil {
				return fmt.Errorf("%s: %v", bin, err)
			}
			table := ""
			for _, l := range strings.Split(out, "\n") {
				if t, ok := strings.CutPrefix(l, "*"); ok {
					table = t
				}
				name, ok := strings.CutPrefix(l, ":KUBE-")
				if !ok {
					continue
				}
				name = "KUBE-" + strings.Fields(name)[0]
				if !slices.Contains(kubelet, name) {
					left = append(left, bin+" "+table+"/"+name)
				}
			}
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("rules of another mode left beside %s: %s", m.name, strings.Join(left, ", "))
	}
	return nil
}

// connProber opens a new TCP connection every probeEvery until stopped
// (or switchTraffic passed) and records each that did not reach one of the
// expected servers at once.
type connProber struct {
	name string
	done chan struct{}
	wg   sync.WaitGroup

	mu       sync.Mutex
	n        int
	failures []string
}

// startConnProber starts probing dst from the namespace. own: the server
// must see the client's own address (pod traffic is not masqueraded);
// otherwise it must see another one (the client is outside the cluster
// CIDR, so its traffic is masqueraded).
func startConnProber(from *netns.NS, name string, dst netip.AddrPort, servers []string, own bool) *connProber {
	p := &connProber{name: name, done: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		deadline := time.After(switchTraffic)
		for {
			select {
			case <-p.done:
				return
			case <-deadline:
				return
			case <-time.After(probeEvery):
			}
			r := from.Request("tcp", dst, netns.DialOptions{})
			var why string
			switch {
			case r.Outcome != netns.Answered:
				why = r.String()
			case !slices.Contains(servers, r.Server):
				why = fmt.Sprintf("%v; want one of %v", r, servers)
			case r.Took >= lostSYN:
				why = fmt.Sprintf("%v took %v: a SYN was lost", r, r.Took.Round(time.Millisecond))
			case own && r.Peer.Addr() != r.Local.Addr():
				why = fmt.Sprintf("%v; want the pod to see %s", r, r.Local.Addr())
			case !own && r.Peer.Addr() == r.Local.Addr():
				why = fmt.Sprintf("%v; want it masqueraded", r)
			}
			p.mu.Lock()
			p.n++
			if why != "" {
				p.failures = append(p.failures, time.Now().Format("15:04:05.000")+" "+why)
			}
			p.mu.Unlock()
		}
	}()
	return p
}

func (p *connProber) stop() {
	p.mu.Lock()
	select {
	case <-p.done:
	default:
		close(p.done)
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// result is the number of connections made and the failures among them.
func (p *connProber) result() (int, []string) {
	p.stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n, p.failures
}

// stream is a long-lived connection that echoes a line every streamEvery
// until stopped; the first error ends it.
type stream struct {
	name string
	done chan struct{}
	wg   sync.WaitGroup

	mu  sync.Mutex
	n   int
	err error
}

// startStream opens a connection to dst and keeps it busy. The pod it
// landed on must answer every line.
func startStream(t *testing.T, from *netns.NS, name string, dst netip.AddrPort, servers []string) *stream {
	t.Helper()
	sess, err := from.OpenSession(dst, netns.DialOptions{})
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	t.Cleanup(func() { sess.Close() })
	pod := sess.Greeting.Server
	if !slices.Contains(servers, pod) {
		t.Fatalf("stream %s: greeted by %s, want one of %v", name, pod, servers)
	}
	s := &stream{name: name, done: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		deadline := time.After(switchTraffic)
		for i := 0; ; i++ {
			select {
			case <-s.done:
				return
			case <-deadline:
				return
			case <-time.After(streamEvery):
			}
			msg := fmt.Sprintf("%d", i)
			got, err := sess.Echo(msg, 2*time.Second)
			if err == nil && got != pod+" "+msg {
				err = fmt.Errorf("echo %q answered %q, want %q", msg, got, pod+" "+msg)
			}
			s.mu.Lock()
			if err != nil {
				s.err = fmt.Errorf("%s: %w", time.Now().Format("15:04:05.000"), err)
				s.mu.Unlock()
				return
			}
			s.n++
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *stream) stop() {
	s.mu.Lock()
	select {
	case <-s.done:
	default:
		close(s.done)
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// result is the number of lines echoed and the error that ended the
// stream (nil if it was stopped while healthy).
func (s *stream) result() (int, error) {
	s.stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n, s.err
}
