package kernel

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/testutil/netns"
	"github.com/kproxy/kproxy/internal/testutil/vm"
)

// peerRule says which source address the answering pod must have seen.
type peerRule int

const (
	// peerAny: not checked.
	peerAny peerRule = iota
	// peerOwn: the client's own address (no SNAT: in-cluster traffic, or
	// externalTrafficPolicy Local preserving the client IP).
	peerOwn
	// peerMasq: masqueraded by probe.masqBy (see kcluster.masqueradedBy).
	peerMasq
)

// probe is a set of identical requests and what each must give.
type probe struct {
	from    string // "client", a node or a pod
	network string // "tcp" or "udp"
	dst     string // "198.19.0.10:80"
	// source binds the client socket to this address (client: clientAlt).
	source netip.Addr
	// n requests; 0 means 1, or 24 with every.
	n int

	outcome netns.Outcome // the zero value is Answered
	// servers: each answer comes from one of these pods; every: and each
	// of them answers at least once (n random picks among two endpoints
	// all land on one with probability 2^-(n-1): 1e-7 for the default n).
	servers []string
	every   bool
	// same: all answers come from one server (session affinity).
	same bool
	peer peerRule
	// masqBy is the node that masquerades (peerMasq).
	masqBy string
	// within bounds how long a refusal may take: a reject answers at
	// once, a drop would wait for the timeout.
	within time.Duration
	// nftOnly: not in iptables mode (rejecting undefined ports of a
	// ClusterIP): upstream's iptables mode lets such packets route. ipvs
	// mode rejects them as nftables mode does (upstream's
	// KUBE-IPVS-FILTER rejects new connections to a kube-ipvs0 address
	// that no virtual server takes).
	nftOnly bool
	// ipt is what to expect instead in iptables mode, where upstream
	// differs (node ports on every local address and on 127.0.0.1, no
	// reject of undefined ports): its from, network and dst default to
	// this probe's. ipvs mode takes it too, unless ipvs says otherwise.
	ipt *probe
	// ipvs is what to expect instead in ipvs mode, where upstream's ipvs
	// mode differs from its iptables mode (the comment says how).
	ipvs *probe
}

// forMode returns the probe to run in mode m.
func (p probe) forMode(m proxyMode) probe {
	alt := p.ipt
	if m.ipvs && p.ipvs != nil {
		alt = p.ipvs
	}
	if !m.iptables || alt == nil {
		return p
	}
	q := *alt
	if q.from == "" {
		q.from = p.from
	}
	if q.network == "" {
		q.network = p.network
	}
	if q.dst == "" {
		q.dst = p.dst
	}
	return q
}

// dropTimeout is how long a request waits before it counts as dropped.
// Answers between namespaces come in well under a millisecond.
const dropTimeout = time.Second

func (p probe) String() string {
	s := fmt.Sprintf("%s %s from %s", p.network, p.dst, p.from)
	if p.source.IsValid() {
		s += " (source " + p.source.String() + ")"
	}
	return s
}

// run sends the requests and checks them, reporting every mismatch.
func (c *kcluster) run(t *testing.T, p probe) {
	t.Helper()
	from := c.ns(p.from)
	dst := ap(p.dst)
	n := p.n
	if n == 0 {
		n = 1
		if p.every {
			n = 24
		}
	}
	opts := netns.DialOptions{Source: p.source}
	switch {
	case p.outcome == netns.Timeout:
		opts.Timeout = dropTimeout
	case vm.InVM():
		// The emulated VM (no KVM) answers an SCTP handshake in
		// seconds when the host is busy.
		opts.Timeout = 10 * time.Second
	}
	seen := map[string]int{}
	var first string
	for i := 0; i < n; i++ {
		r := from.Request(p.network, dst, opts)
		if r.Outcome != p.outcome {
			t.Fatalf("%v: request %d %v; want %v", p, i+1, r, p.outcome)
		}
		if p.within > 0 && r.Took > p.within {
			t.Errorf("%v: %v took %v; want within %v", p, r.Outcome, r.Took, p.within)
		}
		if r.Outcome != netns.Answered {
			continue
		}
		seen[r.Server]++
		if first == "" {
			first = r.Server
		}
		if len(p.servers) > 0 && !slices.Contains(p.servers, r.Server) {
			t.Errorf("%v: %v; want one of %v", p, r, p.servers)
		}
		if p.same && r.Server != first {
			t.Errorf("%v: request %d %v; want the same server as the first request, %s", p, i+1, r, first)
		}
		switch p.peer {
		case peerOwn:
			if r.Peer.Addr() != r.Local.Addr() {
				t.Errorf("%v: %v; want the pod to see the client's own address %s", p, r, r.Local.Addr())
			}
		case peerMasq:
			want := c.masqueradedBy(p.masqBy, r.Server, dst.Addr())
			if r.Peer.Addr() != want {
				t.Errorf("%v: %v; want it masqueraded by %s to %s (client is %s)", p, r, p.masqBy, want, r.Local.Addr())
			}
		}
	}
	if p.every {
		for _, s := range p.servers {
			if seen[s] == 0 {
				t.Errorf("%v: %s never answered in %d requests (answers: %v)", p, s, n, seen)
			}
		}
	}
}

// masqueradedBy returns the source address a pod sees when the node
// masquerades traffic to it: the node's address on the way to the pod
// (cbr0's for its own pods, its LAN address for other nodes' pods), of
// the family of like.
func (c *kcluster) masqueradedBy(node, pod string, like netip.Addr) netip.Addr {
	c.t.Helper()
	n := c.Node(c.t, node)
	p, ok := c.Pods[pod]
	if !ok {
		// Not a pod (the client's load balancer): never masqueraded to.
		return netip.Addr{}
	}
	if p.Node == n {
		for _, gw := range n.Gateways {
			if gw.Is4() == like.Is4() {
				return gw
			}
		}
	}
	return n.Addr(like)
}
