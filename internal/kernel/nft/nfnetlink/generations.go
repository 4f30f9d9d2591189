package nfnetlink

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// Generations tells whether anything but kproxy committed an nf_tables
// transaction in a stretch of time, without listening to notifications.
// The kernel numbers the ruleset's generations: each commit that changes
// something moves the generation id on by one (nf_tables_commit's
// base_seq); an aborted batch, and a committed one that changed nothing,
// leave it. Generations counts the batches its adapters (WithGenerations)
// commit from the generation before the first of them; when the current
// generation is further on than that count, another program committed.
//
// kproxy's drift monitor uses it to subscribe only after the first sync:
// the kernel builds a notification per changed object only while the
// group has a listener, and at 10k services those of kproxy's own first
// sync cost 11-15 % of its CPU. What the count cannot tell: who
// committed (a commit to another program's table counts as well) and
// one foreign commit in the same stretch as a batch of kproxy's that
// changed nothing (the two cancel out).
type Generations struct {
	mu   sync.Mutex
	idle sync.Cond // signalled when inflight drops to 0
	// inflight counts batches sent and not yet answered.
	inflight int
	started  bool
	base     uint32 // the generation before the first batch counted
	own      uint32 // batches of ours committed since
	// unsure: a batch's outcome is unknown (the socket failed).
	unsure bool
}

// WithGenerations makes the adapter count its committed batches in g
// (shared by the adapters of every family).
func WithGenerations(g *Generations) NetlinkOption {
	return func(n *Netlink) error { n.gens = g; return nil }
}

// begin notes a batch about to be sent on c, first reading the base
// generation through c if this is the first.
func (g *Generations) begin(ctx context.Context, c *nlConn) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.started {
		gen, err := generation(ctx, c)
		if err != nil {
			return err
		}
		g.base, g.started = gen, true
	}
	g.inflight++
	return nil
}

// end notes a batch's outcome: committed (no error reported), or unknown.
func (g *Generations) end(committed, unknown bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if committed {
		g.own++
	}
	g.unsure = g.unsure || unknown
	if g.inflight--; g.inflight == 0 && g.idle.L != nil {
		g.idle.Broadcast()
	}
}

// Foreign reports whether a transaction other than the batches counted
// may have committed since the first of them: true also when none was
// counted or an outcome is unknown. It waits for batches in flight, and
// holds new ones back while it reads the generation through a socket of
// n's namespace.
func (g *Generations) Foreign(ctx context.Context, n *Netlink) (bool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.idle.L == nil {
		g.idle.L = &g.mu
	}
	for g.inflight > 0 {
		g.idle.Wait()
	}
	if !g.started || g.unsure {
		return true, nil
	}
	// A socket of its own: n's are used under n.mu, which a batch holds
	// while it waits in begin.
	c, err := n.dial()
	if err != nil {
		return true, err
	}
	defer c.Close()
	gen, err := generation(ctx, c)
	if err != nil {
		return true, err
	}
	return gen-g.base != g.own, nil
}

// generation asks for the ruleset's generation id (NFT_MSG_GETGEN).
func generation(ctx context.Context, c *nlConn) (uint32, error) {
	b, err := c.get(ctx, unix.NFT_MSG_GETGEN, unix.AF_UNSPEC, nil)
	if err != nil {
		return 0, fmt.Errorf("nft: querying the nf_tables generation: %w", err)
	}
	var gen uint32
	found := false
	forEachAttr(b, func(typ uint16, data []byte) {
		if typ == unix.NFTA_GEN_ID && len(data) >= 4 {
			gen, found = binary.BigEndian.Uint32(data), true
		}
	})
	if !found {
		return 0, fmt.Errorf("nft: the nf_tables generation reply has no id")
	}
	return gen, nil
}
