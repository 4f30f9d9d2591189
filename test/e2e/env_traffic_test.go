package e2e

// Checking the cluster with real traffic: requests from one namespace,
// which pod answered and the source address it saw (the client's own, or
// masqueraded to one of node-a's: 198.18.0.10, fd00:18::10 or cbr0's), and
// long-lived UDP flows. The address plan is in env_test.go's top comment.

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// request sends one request (a new connection, or a new UDP socket) and
// says who answered.
func request(from *netns.NS, network string, dst netip.AddrPort) netns.Reply {
	return from.Request(network, dst, netns.DialOptions{Timeout: requestTimeout})
}

// peerCheck says what is wrong with the source address a server saw ("" if
// nothing).
type peerCheck func(peer netip.Addr) string

// anyPeer accepts every source address.
func anyPeer(netip.Addr) string { return "" }

// keeps wants the client's own address: not masqueraded.
func keeps(src netip.Addr) peerCheck {
	return func(peer netip.Addr) string {
		if peer != src {
			return fmt.Sprintf("saw %s, want the client's own %s (not masqueraded)", peer, src)
		}
		return ""
	}
}

// masqueraded wants one of node-a's addresses (the one masquerading picks
// towards the endpoint: the LAN address for b1, cbr0's for a local pod).
func (e *env) masqueraded() peerCheck {
	own := append([]netip.Addr{nodeAIP, nodeAIP6}, e.node.Gateways...)
	return func(peer netip.Addr) string {
		if !slices.Contains(own, peer) {
			return fmt.Sprintf("saw %s, want one of node-a's addresses %v (masqueraded)", peer, own)
		}
		return ""
	}
}

// serversOnce sends requests until every server in want has answered
// (bounded). It fails at the first request that is not answered, or
// answered by a server not in want, or whose source as the server saw it
// fails peer.
func serversOnce(from *netns.NS, network string, dst netip.AddrPort, want []string, peer peerCheck) error {
	seen := map[string]bool{}
	// With two endpoints chosen at random, 40 tries all missing one
	// happens once in 2^39.
	for range 40 {
		r := request(from, network, dst)
		if r.Outcome != netns.Answered {
			return fmt.Errorf("%s %s from %s: %v", network, dst, from.Role, r)
		}
		if !slices.Contains(want, r.Server) {
			return fmt.Errorf("%s %s from %s: answered by %s, want only %v", network, dst, from.Role, r.Server, want)
		}
		if msg := peer(r.Peer.Addr()); msg != "" {
			return fmt.Errorf("%s %s from %s: %s %s", network, dst, from.Role, r.Server, msg)
		}
		seen[r.Server] = true
		if len(seen) == len(want) {
			return nil
		}
	}
	return fmt.Errorf("%s %s from %s: only %v answered, want all of %v", network, dst, from.Role, seen, want)
}

// expectServers waits until requests from `from` to dst are answered by the
// servers in want and only them, each at least once.
func (e *env) expectServers(from string, network string, dst netip.AddrPort, want ...string) {
	e.t.Helper()
	e.expectServersPeer(from, network, dst, anyPeer, want...)
}

// expectServersPeer is expectServers where the source address the servers
// see must also pass peer.
func (e *env) expectServersPeer(from string, network string, dst netip.AddrPort, peer peerCheck, want ...string) {
	e.t.Helper()
	n := e.ns(from)
	e.eventually(fmt.Sprintf("%s %s from %s reaches %v", network, dst, from, want), func() error {
		return serversOnce(n, network, dst, want, peer)
	})
}

// expectOutcome waits until a request from `from` to dst ends with want
// (Refused: rejected; Timeout: dropped).
func (e *env) expectOutcome(from string, network string, dst netip.AddrPort, want netns.Outcome) {
	e.t.Helper()
	n := e.ns(from)
	e.eventually(fmt.Sprintf("%s %s from %s is %v", network, dst, from, want), func() error {
		if r := request(n, network, dst); r.Outcome != want {
			return fmt.Errorf("%v", r)
		}
		return nil
	})
}

// expectUnanswered waits until requests from `from` to dst get no answer
// from any pod, however they fail (refused, dropped, unreachable).
func (e *env) expectUnanswered(from string, network string, dst netip.AddrPort) {
	e.t.Helper()
	n := e.ns(from)
	e.eventually(fmt.Sprintf("%s %s from %s is not answered", network, dst, from), func() error {
		if r := request(n, network, dst); r.Outcome == netns.Answered {
			return fmt.Errorf("%v", r)
		}
		return nil
	})
}

// expectCaptured waits until the node's rules capture (or, with present
// false, no longer capture) every key.
func (e *env) expectCaptured(present bool, keys ...string) {
	e.t.Helper()
	e.eventually(fmt.Sprintf("rules capture %v: %v", keys, present), func() error {
		got, err := e.mode.captured(e.node.Name)
		if err != nil {
			return err
		}
		for _, k := range keys {
			if slices.Contains(got, k) != present {
				return fmt.Errorf("captured %v", got)
			}
		}
		return nil
	})
}

// udpFlow is a long-lived UDP "connection": one socket, one source port, so
// one conntrack entry for as long as it keeps sending.
type udpFlow struct {
	from string
	ask  func() netns.Reply
}

func (e *env) openUDPFlow(from string, dst netip.AddrPort, srcPort int) *udpFlow {
	e.t.Helper()
	conn, err := e.ns(from).DialUDP(dst, netns.DialOptions{SourcePort: srcPort})
	if err != nil {
		e.t.Fatalf("UDP socket from %s to %s: %v", from, dst, err)
	}
	e.t.Cleanup(func() { conn.Close() })
	return &udpFlow{from: from, ask: func() netns.Reply {
		return netns.UDPAsk(conn, time.Now().Add(300*time.Millisecond))
	}}
}

// expectFlow waits (at most flowGrace) until the flow's datagrams get want
// (by one of servers when answered), then checks that the next five do too.
func (e *env) expectFlow(what string, f *udpFlow, want netns.Outcome, servers ...string) {
	e.t.Helper()
	ok := func(r netns.Reply) bool {
		return r.Outcome == want && (want != netns.Answered || slices.Contains(servers, r.Server))
	}
	deadline := time.Now().Add(flowGrace)
	for {
		e.alive()
		r := f.ask()
		if ok(r) {
			break
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: UDP flow from %s: %v, still not %v %v after %s", what, f.from, r, want, servers, flowGrace)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for range 5 {
		if r := f.ask(); !ok(r) {
			e.t.Fatalf("%s: UDP flow from %s: %v after it had %v %v", what, f.from, r, want, servers)
		}
	}
}
