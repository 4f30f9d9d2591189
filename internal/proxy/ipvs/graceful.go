package ipvs

import (
	"fmt"
	"net/netip"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/kernel/conntrack"
	"github.com/kproxy/kproxy/internal/kernel/ipvs"
)

// graceful is the graceful termination of real servers, as upstream's
// graceful termination manager: a removed TCP real server is kept at
// weight 0, so that it gets no new connections while its open ones go on,
// and deleted once it has none left (ActiveConns+InactiveConns 0) or its
// grace period is over. UDP and SCTP real servers go at once (upstream:
// connectionless, their "connections" would never drain), and their UDP
// conntrack entries with them, so that the next datagram of a flow is
// scheduled again instead of following the entry to the gone endpoint.
type graceful struct {
	ipvs   ipvs.Handle
	ct     conntrack.Interface
	family v1.IPFamily
	period time.Duration
	// pending: real servers at weight 0, with the time they were removed.
	pending map[pendingKey]time.Time
}

type pendingKey struct {
	vs   ipvs.VirtualServer
	dest destKey
}

func newGraceful(h ipvs.Handle, ct conntrack.Interface, f v1.IPFamily, period time.Duration) *graceful {
	return &graceful{ipvs: h, ct: ct, family: f, period: period, pending: map[pendingKey]time.Time{}}
}

func (g *graceful) len() int { return len(g.pending) }

// remove takes real server d out of vs: deleted at once (true) when vs is
// not TCP or d has no connections, otherwise set to weight 0 and left to
// run (false).
func (g *graceful) remove(vs ipvs.VirtualServer, d ipvs.Destination, now time.Time) (bool, error) {
	k := pendingKey{vs, destKey{d.Addr, d.Port}}
	if vs.Protocol == protoTCP {
		if _, ok := g.pending[k]; ok {
			return false, nil // terminating already; run decides
		}
		conns, err := g.conns(vs, k.dest)
		if err != nil {
			return false, err
		}
		if conns > 0 {
			if d.Weight != 0 {
				d.Weight = 0
				if err := g.ipvs.UpdateDestination(vs, d); err != nil && !isNotFound(err) {
					return false, fmt.Errorf("setting real server %s of %s to weight 0: %w", addrPort(k.dest), vs, err)
				}
			}
			g.pending[k] = now
			klog.V(2).InfoS("Real server removed; kept at weight 0 until its connections end", "virtualServer", vs, "realServer", addrPort(k.dest), "connections", conns, "gracePeriod", g.period)
			return false, nil
		}
	}
	if err := g.delete(vs, k.dest); err != nil {
		return false, err
	}
	if vs.Protocol == protoUDP {
		g.clearUDP(vs, k.dest)
	}
	return true, nil
}

// conns returns a real server's connections; -1 reads as "none known"
// when the server is gone.
func (g *graceful) conns(vs ipvs.VirtualServer, dk destKey) (int, error) {
	ds, err := g.ipvs.Destinations(vs)
	if err != nil {
		if isNotFound(err) {
			return 0, nil
		}
		return 0, fmt.Errorf("listing the real servers of %s: %w", vs, err)
	}
	for _, d := range ds {
		if d.Addr.Unmap() == dk.addr && d.Port == dk.port {
			return d.ActiveConns + d.InactiveConns, nil
		}
	}
	return 0, nil
}

func (g *graceful) delete(vs ipvs.VirtualServer, dk destKey) error {
	err := g.ipvs.DeleteDestination(vs, ipvs.Destination{Addr: dk.addr, Port: dk.port})
	if err != nil && !isNotFound(err) {
		return fmt.Errorf("deleting real server %s of %s: %w", addrPort(dk), vs, err)
	}
	return nil
}

// cancel: the endpoint is wanted again (the sync sets its weight back).
func (g *graceful) cancel(vs ipvs.VirtualServer, dk destKey) {
	if len(g.pending) == 0 {
		return
	}
	delete(g.pending, pendingKey{vs, dk})
}

// forget drops the real servers of a deleted virtual server.
func (g *graceful) forget(vs ipvs.VirtualServer) {
	for k := range g.pending {
		if k.vs == vs {
			delete(g.pending, k)
		}
	}
}

// run deletes the terminating real servers whose connections ended or
// whose grace period is over, and reports those it deleted. Errors are
// logged; the server stays pending and the next run tries again.
func (g *graceful) run(now time.Time) []pendingKey {
	var done []pendingKey
	for k, since := range g.pending {
		conns, err := g.conns(k.vs, k.dest)
		if err != nil {
			klog.ErrorS(err, "Could not read the connections of a terminating real server", "virtualServer", k.vs, "realServer", addrPort(k.dest))
			continue
		}
		expired := now.Sub(since) >= g.period
		if conns > 0 && !expired {
			continue
		}
		if err := g.delete(k.vs, k.dest); err != nil {
			klog.ErrorS(err, "Could not delete a terminating real server", "virtualServer", k.vs, "realServer", addrPort(k.dest))
			continue
		}
		klog.V(2).InfoS("Deleted terminating real server", "virtualServer", k.vs, "realServer", addrPort(k.dest), "connections", conns, "gracePeriodOver", expired)
		delete(g.pending, k)
		done = append(done, k)
	}
	return done
}

// clearUDP deletes the UDP conntrack entries of flows the virtual server
// sent to the real server.
func (g *graceful) clearUDP(vs ipvs.VirtualServer, dk destKey) {
	if g.ct == nil {
		return
	}
	f := conntrack.Filter{OrigDst: vs.Addr, OrigDstPort: vs.Port, ReplySrc: dk.addr}
	n, err := g.ct.DeleteUDP(vs.Addr.Is6(), []conntrack.Filter{f})
	if err != nil {
		klog.ErrorS(err, "Could not delete stale UDP conntrack entries", "virtualServer", vs, "realServer", addrPort(dk))
		return
	}
	klog.V(4).InfoS("Deleted stale UDP conntrack entries", "virtualServer", vs, "realServer", addrPort(dk), "entries", n)
}

func addrPort(dk destKey) netip.AddrPort { return netip.AddrPortFrom(dk.addr, dk.port) }
