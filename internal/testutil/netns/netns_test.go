package netns

// Tests of the harness itself, without any proxy: plain routing between the
// namespaces it builds.
//
// Address ranges (only inside the test namespaces):
//   198.18.0.0/24, fd00:18::/64      the LAN: client .100, node-a .10, node-b .11
//   198.18.129.0/24, fd00:18:1:a::/64  node-a's pods (gateway .1)
//   198.18.130.0/24, fd00:18:1:b::/64  node-b's pods (gateway .1)
//   203.0.113.100/24                 the client's second address
//   198.19.0.0/16                    routed by the client via node-a; nothing answers there

import (
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"
)

func testSpec() ClusterSpec {
	pp := netip.MustParsePrefix
	ip := netip.MustParseAddr
	return ClusterSpec{
		Nodes: []NodeSpec{
			{Name: "node-a", Addrs: []netip.Prefix{pp("198.18.0.10/24"), pp("fd00:18::10/64")},
				PodCIDRs: []netip.Prefix{pp("198.18.129.0/24"), pp("fd00:18:1:a::/64")}},
			{Name: "node-b", Addrs: []netip.Prefix{pp("198.18.0.11/24"), pp("fd00:18::11/64")},
				PodCIDRs: []netip.Prefix{pp("198.18.130.0/24"), pp("fd00:18:1:b::/64")}},
		},
		Client: ClientSpec{
			Addrs:         []netip.Prefix{pp("198.18.0.100/24"), pp("fd00:18::100/64"), pp("203.0.113.100/24")},
			ServiceRoutes: []netip.Prefix{pp("198.19.0.0/16")},
			Via:           "node-a",
		},
		Pods: []PodSpec{
			{Name: "pa", Node: "node-a", IPs: []netip.Addr{ip("198.18.129.10"), ip("fd00:18:1:a::10")}},
			{Name: "pa2", Node: "node-a", IPs: []netip.Addr{ip("198.18.129.11")}},
			{Name: "pb", Node: "node-b", IPs: []netip.Addr{ip("198.18.130.10"), ip("fd00:18:1:b::10")}},
		},
	}
}

func TestClusterRouting(t *testing.T) {
	Require(t)
	t.Parallel()
	c := NewCluster(t, testSpec())
	for _, p := range c.Pods {
		ServeEcho(t, p.NS, p.Spec.Name, "tcp", 8080)
		ServeEcho(t, p.NS, p.Spec.Name, "udp", 8053)
	}
	ap := netip.MustParseAddrPort
	ip := netip.MustParseAddr
	cases := []struct {
		name    string
		from    *NS
		network string
		dst     netip.AddrPort
		opts    DialOptions
		want    Outcome
		server  string
		peer    netip.Addr
	}{
		{"client to node-a pod", c.Client, "tcp", ap("198.18.129.10:8080"), DialOptions{}, Answered, "pa", ip("198.18.0.100")},
		{"client to node-b pod v6", c.Client, "tcp", ap("[fd00:18:1:b::10]:8080"), DialOptions{}, Answered, "pb", ip("fd00:18::100")},
		{"client second address", c.Client, "tcp", ap("198.18.130.10:8080"), DialOptions{Source: ip("203.0.113.100")}, Answered, "pb", ip("203.0.113.100")},
		{"pod to pod same node", c.Pods["pa"].NS, "tcp", ap("198.18.129.11:8080"), DialOptions{}, Answered, "pa2", ip("198.18.129.10")},
		{"pod to pod across nodes udp", c.Pods["pa"].NS, "udp", ap("198.18.130.10:8053"), DialOptions{}, Answered, "pb", ip("198.18.129.10")},
		{"pod to pod across nodes v6 udp", c.Pods["pb"].NS, "udp", ap("[fd00:18:1:a::10]:8053"), DialOptions{}, Answered, "pa", ip("fd00:18:1:b::10")},
		{"node to its pod", c.Nodes["node-a"].NS, "tcp", ap("198.18.129.11:8080"), DialOptions{}, Answered, "pa2", ip("198.18.129.1")},
		{"closed tcp port is refused", c.Client, "tcp", ap("198.18.129.10:9"), DialOptions{}, Refused, "", netip.Addr{}},
		{"closed udp port is refused", c.Client, "udp", ap("198.18.129.10:9"), DialOptions{}, Refused, "", netip.Addr{}},
		// The client sends 198.19.0.0/16 to node-a, which has no such route
		// but a default route back to the client, which does not forward:
		// the packet dies there silently.
		{"unrouted service range times out", c.Client, "tcp", ap("198.19.0.10:80"), DialOptions{Timeout: 500 * time.Millisecond}, Timeout, "", netip.Addr{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.from.Request(tc.network, tc.dst, tc.opts)
			if r.Outcome != tc.want {
				t.Fatalf("%s %s from %s: %v, want %v", tc.network, tc.dst, tc.from.Role, r, tc.want)
			}
			if tc.want != Answered {
				return
			}
			if r.Server != tc.server || r.Peer.Addr() != tc.peer {
				t.Errorf("%s %s from %s: %v, want answered by %s seeing %s", tc.network, tc.dst, tc.from.Role, r, tc.server, tc.peer)
			}
			if r.Peer != r.Local {
				t.Errorf("server saw %s but the client socket is %s", r.Peer, r.Local)
			}
		})
	}

	t.Run("session", func(t *testing.T) {
		s, err := c.Client.OpenSession(ap("198.18.130.10:8080"), DialOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if s.Greeting.Server != "pb" {
			t.Errorf("greeting from %q, want pb", s.Greeting.Server)
		}
		for _, msg := range []string{"one", "two"} {
			got, err := s.Echo(msg, time.Second)
			if err != nil || got != "pb "+msg {
				t.Errorf("Echo(%q) = %q, %v; want %q", msg, got, err, "pb "+msg)
			}
		}
	})

	t.Run("udp fixed source port", func(t *testing.T) {
		conn, err := c.Client.DialUDP(ap("198.18.129.10:8053"), DialOptions{SourcePort: 40053})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		for i := 0; i < 3; i++ {
			r := UDPAsk(conn, time.Now().Add(time.Second))
			if r.Outcome != Answered || r.Peer != ap("198.18.0.100:40053") {
				t.Fatalf("ask %d: %v, want answered seeing 198.18.0.100:40053", i, r)
			}
		}
	})
}

func TestSysctlIsPerNamespace(t *testing.T) {
	Require(t)
	t.Parallel()
	id := RandomID(3)
	a, b := New(t, id, "a"), New(t, id, "b")
	if err := a.Sysctl("net.ipv4.ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ns   *NS
		want string
	}{{a, "1"}, {b, "0"}} {
		got, err := tc.ns.ReadSysctl("net.ipv4.ip_forward")
		if err != nil || got != tc.want {
			t.Errorf("ip_forward in %s = %q, %v; want %q", tc.ns.Role, got, err, tc.want)
		}
	}
}

func TestProcess(t *testing.T) {
	Require(t)
	t.Parallel()
	n := New(t, RandomID(3), "proc")
	dir := t.TempDir()
	// A shell that logs the namespace's interfaces, then waits for SIGTERM.
	// Markers are computed by the shell: the log's header line repeats the
	// command line, so a literal marker would match too early.
	p := StartProcess(t, n, "sh", dir, "sh", "-c", `ip -o link show; echo ready-$((40+2)); trap 'echo bye-$((40+2)); exit 0' TERM; while :; do sleep 0.1; done`)
	Eventually(t, 5*time.Second, "the process to log", func() (bool, string) {
		return strings.Contains(p.Log(), "ready-42"), p.Log()
	})
	log := p.Log()
	if !strings.Contains(log, "lo:") || strings.Contains(log, "eth0") {
		t.Errorf("the process does not see only the new namespace's loopback:\n%s", log)
	}
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	if done, _ := p.Exited(); !done {
		t.Fatal("still running after Stop")
	}
	if !strings.Contains(p.Log(), "bye-42") {
		t.Errorf("SIGTERM not delivered:\n%s", p.Log())
	}
	if err := p.Restart(n, "sh", "-c", "echo again-$((40+2)); sleep 30"); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 5*time.Second, "the restarted process to log", func() (bool, string) {
		return strings.Contains(p.Log(), "again-42"), p.Log()
	})
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p.LogPath); err != nil {
		t.Fatal(err)
	}
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want Outcome
	}{
		{nil, Answered},
		{os.ErrDeadlineExceeded, Timeout},
	} {
		if got := Classify(tc.err); got != tc.want {
			t.Errorf("Classify(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestSCTPSupported(t *testing.T) {
	Require(t)
	t.Parallel()
	err := New(t, RandomID(3), "sctp").SCTPSupported()
	if err != nil && !errors.Is(err, ErrSCTPUnsupported) {
		t.Fatalf("SCTPSupported: %v; want nil or ErrSCTPUnsupported", err)
	}
	t.Logf("SCTPSupported: %v", err)
}
