package proxy

import (
	"net/netip"
	"slices"
	"sync"

	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/model"
)

// FullSyncWanter is a backend that can tell that its next sync must be
// full although nothing the loop follows changed. The loop asks before
// every sync, also the periodic one with nothing to do.
type FullSyncWanter interface {
	WantsFullSync() bool
}

// AddressWatch follows the host addresses a backend's node port rules
// were rendered for (nodePortAddresses given as CIDRs): only full syncs
// read the host's addresses, and full syncs are hourly, so between them
// the loop asks Changed (through FullSyncWanter) whether the addresses
// the CIDRs select are still those. An address added to or removed from
// an interface is then served, or no longer, within a sync period, as
// upstream's iptables mode (which reads them at every sync) does.
type AddressWatch struct {
	read func() ([]netip.Addr, error)
	pick func(node *model.Node, addrs []netip.Addr) []netip.Addr

	mu    sync.Mutex
	valid bool
	node  *model.Node
	had   []netip.Addr
}

// NewAddressWatch watches the addresses pick selects among those read
// returns; nil when read is nil (no host to ask).
func NewAddressWatch(read func() ([]netip.Addr, error), pick func(node *model.Node, addrs []netip.Addr) []netip.Addr) *AddressWatch {
	if read == nil {
		return nil
	}
	return &AddressWatch{read: read, pick: pick}
}

// Rendered records what a full sync the kernel accepted was rendered
// for: the node and the addresses picked. all says the rules match every
// local address (no CIDRs): nothing to watch until the next full sync.
func (w *AddressWatch) Rendered(node *model.Node, picked []netip.Addr, all bool) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.valid, w.node, w.had = !all, node, slices.Clone(picked)
}

// Changed reads the host's addresses and reports whether the ones picked
// differ from those of the last full sync. Before a full sync, and when
// the addresses cannot be read, it reports false (the next full sync
// reads them anyway, and reports a failure).
func (w *AddressWatch) Changed() bool {
	if w == nil {
		return false
	}
	w.mu.Lock()
	valid, node, had := w.valid, w.node, w.had
	w.mu.Unlock()
	if !valid {
		return false
	}
	addrs, err := w.read()
	if err != nil {
		return false
	}
	now := w.pick(node, addrs)
	if slices.Equal(now, had) {
		return false
	}
	klog.V(2).InfoS("The node port addresses changed on the host; the next sync is full", "before", had, "now", now)
	return true
}
