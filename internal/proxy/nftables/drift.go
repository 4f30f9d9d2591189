package nftables

import (
	"context"
	"fmt"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/proxy"
)

// Drift in nftables mode is noticed through nf_tables change
// notifications (nft.Watcher): each names the object and the netlink port
// id of the socket whose transaction changed it. kproxy sends every
// transaction on one long-lived socket per family (nfnetlink.Netlink), so a
// change to one of its tables from any other port id is someone else's.
// That holds whatever the timing, unlike a "sync in progress" window
// (which would blame kproxy for a foreign change made during its own
// sync) or generation numbers (which say that something committed, not
// who). The notifications of one `nft flush ruleset` arrive together;
// they are collected for DriftWindow and reported as one, then the tables
// they name are repaired (RepairTables: re-created as last applied, see
// repair.go); lost notifications repair the family by a full sync.
//
// The watcher subscribes only after the first sync of every family: the
// kernel builds notifications only while someone listens, and those of
// kproxy's own first sync at 10k services were 11-15 % of its CPU. What
// others changed before the subscription is not notified; Gap says
// whether anything else committed (nfnetlink.Generations), and if so
// every family is repaired by a full sync, once. Generations do not say
// who committed: a commit to another program's table in that stretch
// costs one full sync that was not needed.

// DriftWindow is how long notifications are collected after the first
// foreign one before reporting and repairing: long enough for a storm of
// one transaction to arrive whole, short against the 1 s repair budget.
const DriftWindow = 100 * time.Millisecond

// DriftWatch turns nf_tables notifications into repairs.
type DriftWatch struct {
	Watcher nft.Watcher
	// Own reports whether a port id is one of kproxy's sockets.
	Own func(portID uint32) bool
	// Table is the main table's name (DefaultTableName when empty); its
	// shard tables are watched too.
	Table string
	// Families are the families kproxy programs.
	Families []v1.IPFamily
	// Window overrides DriftWindow (tests).
	Window time.Duration
	// Repair asks for a full sync of a family (Loop.Repair).
	Repair func(v1.IPFamily)
	// RepairTables, when set, is asked instead to repair the tables
	// named by the notifications (Proxier.RepairTables and
	// Loop.RepairSoon); Repair still serves lost notifications.
	RepairTables func(v1.IPFamily, []string)
	// Report reports what differed (proxy.ReportDrift by default).
	Report func([]proxy.Drift)
	// Gap, when set, is asked once Run has started watching: whether
	// others may have changed the rules before the watcher subscribed.
	// When it says so (or fails) every family is repaired (Repair).
	Gap func(context.Context) (bool, error)
}

// Run watches until ctx ends or the watcher fails.
func (w *DriftWatch) Run(ctx context.Context) error {
	window := w.Window
	if window == 0 {
		window = DriftWindow
	}
	report := w.Report
	if report == nil {
		report = func(ds []proxy.Drift) { proxy.ReportDrift("nftables", "notification", ds) }
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	evc := make(chan []nft.Event, 64)
	errc := make(chan error, 1)
	go func() {
		errc <- w.Watcher.Watch(ctx, func(evs []nft.Event) {
			// When this blocks the socket's buffer fills and the kernel
			// drops notifications: reported as Lost, which repairs all.
			select {
			case evc <- evs:
			case <-ctx.Done():
			}
		})
	}()
	if w.Gap != nil {
		w.checkGap(ctx)
	}
	c := newCoalescer(w.Table, w.Families, w.Own)
	var timer <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return err
		case evs := <-evc:
			if c.add(evs) && timer == nil {
				timer = time.After(window)
			}
		case <-timer:
			timer = nil
			ds, fams, tables := c.take()
			report(ds)
			for _, f := range fams {
				if t, ok := tables[f]; ok && w.RepairTables != nil {
					w.RepairTables(f, t)
				} else {
					w.Repair(f)
				}
			}
		}
	}
}

// checkGap repairs every family when Gap says others committed before
// the watcher subscribed. It is logged, not counted as drift: the commit
// may have been to another program's table.
func (w *DriftWatch) checkGap(ctx context.Context) {
	changed, err := w.Gap(ctx)
	if ctx.Err() != nil || (err == nil && !changed) {
		return
	}
	if err != nil {
		klog.ErrorS(err, "Cannot tell whether others changed nf_tables rules before kproxy listened to notifications; repairing every family by a full sync")
	} else {
		klog.InfoS("Others committed nf_tables transactions before kproxy listened to notifications; repairing every family by a full sync", "ipFamilies", w.Families)
	}
	for _, f := range w.Families {
		w.Repair(f)
	}
}

// objKey identifies one changed object in a report.
type objKey struct {
	family  nft.Family
	kind    nft.ObjKind
	table   string
	name    string
	deleted bool
}

// coalescer collects foreign changes to kproxy's tables until they are
// reported: one entry per object, children of a deleted table, chain or
// set folded into it.
type coalescer struct {
	main     string
	families map[nft.Family]v1.IPFamily
	own      func(uint32) bool
	counts   map[objKey]int
	order    []objKey
	lost     bool
}

func newCoalescer(main string, fams []v1.IPFamily, own func(uint32) bool) *coalescer {
	if main == "" {
		main = DefaultTableName
	}
	c := &coalescer{main: main, families: map[nft.Family]v1.IPFamily{}, own: own, counts: map[objKey]int{}}
	for _, f := range fams {
		c.families[nft.FamilyFor(f)] = f
	}
	return c
}

// add takes a batch of events and reports whether any was a foreign
// change to kproxy's tables (or a loss).
func (c *coalescer) add(evs []nft.Event) bool {
	any := false
	for _, ev := range evs {
		if ev.Lost {
			c.lost, any = true, true
			continue
		}
		if _, ok := c.families[ev.Family]; !ok {
			continue
		}
		if _, shard := ShardIndex(c.main, ev.Table); !shard && ev.Table != c.main {
			continue
		}
		if c.own != nil && c.own(ev.PortID) {
			continue
		}
		k := objKey{family: ev.Family, kind: ev.Kind, table: ev.Table, name: ev.Name, deleted: ev.Deleted}
		if _, seen := c.counts[k]; !seen {
			c.order = append(c.order, k)
		}
		c.counts[k] += max(ev.Count, 1)
		any = true
	}
	return any
}

// take returns the differences collected, children folded into deleted
// parents, the families to repair and, per family whose notifications
// all arrived, the tables they changed; it resets the coalescer.
func (c *coalescer) take() ([]proxy.Drift, []v1.IPFamily, map[v1.IPFamily][]string) {
	defer func() {
		c.counts, c.order, c.lost = map[objKey]int{}, nil, false
	}()
	var out []proxy.Drift
	fams := map[v1.IPFamily]bool{}
	tables := map[v1.IPFamily][]string{}
	if c.lost {
		out = append(out, proxy.Drift{Kind: string(nft.KindUnknown), Change: "notifications lost (receive buffer overflowed); assuming everything changed"})
		for _, f := range c.families {
			fams[f] = true
		}
	}
	deleted := func(kind nft.ObjKind, fam nft.Family, table, name string) bool {
		for _, k := range []nft.ObjKind{kind, nft.KindMap} {
			if _, ok := c.counts[objKey{family: fam, kind: k, table: table, name: name, deleted: true}]; ok {
				return true
			}
			if kind != nft.KindSet {
				break
			}
		}
		return false
	}
	for _, k := range c.order {
		n := c.counts[k]
		// A deleted table's chains, rules, sets and elements went with
		// it; a deleted chain's rules; a deleted set's elements.
		if k.kind != nft.KindTable && k.deleted && deleted(nft.KindTable, k.family, k.table, "") {
			continue
		}
		if k.kind == nft.KindRule && k.deleted && deleted(nft.KindChain, k.family, k.table, k.name) {
			continue
		}
		if k.kind == nft.KindElement && k.deleted && deleted(nft.KindSet, k.family, k.table, k.name) {
			continue
		}
		f := c.families[k.family]
		fams[f] = true
		if !c.lost && !slices.Contains(tables[f], k.table) {
			tables[f] = append(tables[f], k.table)
		}
		out = append(out, proxy.Drift{Family: f, Kind: string(k.kind), Name: objName(k), Change: change(k, n)})
	}
	var fl []v1.IPFamily
	for f := range fams {
		fl = append(fl, f)
	}
	slices.Sort(fl)
	for _, t := range tables {
		slices.Sort(t)
	}
	return out, fl, tables
}

func objName(k objKey) string {
	s := string(k.family) + " " + k.table
	if k.name != "" {
		s += "/" + k.name
	}
	return s
}

// change words what happened: rules are named by their chain, elements by
// their set, so "3 deleted" there means 3 rules or elements of it.
func change(k objKey, n int) string {
	verb := "added"
	if k.deleted {
		verb = "deleted"
	}
	switch {
	case k.kind == nft.KindRule || k.kind == nft.KindElement:
		return fmt.Sprintf("%d %s", n, verb)
	case n > 1:
		return fmt.Sprintf("%s %d times", verb, n)
	}
	return verb
}
