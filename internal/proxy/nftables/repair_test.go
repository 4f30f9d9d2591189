package nftables

// Repair of tables another program changed (repair.go): the example
// cluster (addresses at the top of fixtures_test.go) over 4 IPv4 shard
// tables on the fake kernel, broken behind the proxier's back the way
// `nft delete table`, `nft flush chain` and `nft flush map` would.

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
	"github.com/kproxy/kproxy/internal/testutil/fixtures"
	"github.com/kproxy/kproxy/internal/trace"
)

// breakage changes the fake kernel as another program would; table is
// the one it damages.
type breakage struct {
	name  string
	table string
	run   func(t *testing.T, r *proxierRig)
}

func foreignTx(t *testing.T, r *proxierRig, table string, build func(w nft.TableOps)) {
	t.Helper()
	tx := nft.NewTransaction(r.family(), table)
	build(tx.In(table))
	if err := r.fake.Apply(context.Background(), tx); err != nil {
		t.Fatalf("breaking the rules: %v", err)
	}
}

func deleteTable(table string) breakage {
	return breakage{name: "delete table " + table, table: table, run: func(t *testing.T, r *proxierRig) {
		if err := r.fake.DeleteTable(context.Background(), r.family(), table); err != nil {
			t.Fatal(err)
		}
	}}
}

func breakages(v6 bool) []breakage {
	out := []breakage{
		deleteTable("kube-proxy"),
		deleteTable("kube-proxy-s0"),
		{name: "flush chain services", table: "kube-proxy-s0", run: func(t *testing.T, r *proxierRig) {
			foreignTx(t, r, "kube-proxy-s0", func(w nft.TableOps) { w.Flush(&nft.Chain{Name: chainServices}) })
		}},
		{name: "flush set cluster-ips", table: "kube-proxy", run: func(t *testing.T, r *proxierRig) {
			foreignTx(t, r, "kube-proxy", func(w nft.TableOps) { w.Flush(&nft.Set{Name: setClusterIPs}) })
		}},
		{name: "add a foreign chain", table: "kube-proxy", run: func(t *testing.T, r *proxierRig) {
			foreignTx(t, r, "kube-proxy", func(w nft.TableOps) { w.Add(&nft.Chain{Name: "intruder"}) })
		}},
	}
	if !v6 {
		// The example's IPv4 ports fill 4 shards.
		out = append(out, deleteTable("kube-proxy-s3"), breakage{name: "flush map service-ips", table: "kube-proxy-s2", run: func(t *testing.T, r *proxierRig) {
			foreignTx(t, r, "kube-proxy-s2", func(w nft.TableOps) { w.Flush(&nft.Set{Name: mapServiceIPs, Data: nft.TypeVerdict}) })
		}})
	}
	return out
}

// repairSync tells the proxier which table was damaged and syncs as the
// loop does after RepairSoon: not full, nothing pending.
func (r *proxierRig) repairSync(tables ...string) nft.Transaction {
	r.t.Helper()
	n := len(r.fake.Applies())
	r.p.RepairTables(tables)
	if !r.p.WantsRepair() {
		r.t.Fatal("WantsRepair is false after RepairTables")
	}
	r.mustSync(false)
	if r.p.WantsRepair() {
		r.t.Error("WantsRepair is still true after the sync")
	}
	a := r.fake.Applies()
	if len(a) != n+1 {
		r.t.Fatalf("repair: %d transactions, want 1", len(a)-n)
	}
	return *a[n].Tx
}

// TestRepairRecreatesDamagedTable: after a full sync, each breakage is
// repaired by one transaction on the damaged table alone, and the kernel
// is again what a fresh full sync writes.
func TestRepairRecreatesDamagedTable(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	for _, f := range []v1.IPFamily{model.IPv4, model.IPv6} {
		for _, b := range breakages(f == model.IPv6) {
			t.Run(string(f)+"/"+b.name, func(t *testing.T) {
				r := newProxierRig(t, c, f)
				r.mustSync(true)
				fresh := r.freshDump()
				if d := cmp.Diff(fresh, r.dump()); d != "" {
					t.Fatalf("first sync is not a fresh full sync (-want +got):\n%s", d)
				}
				b.run(t, r)
				if r.dump() == fresh {
					t.Fatal("the breakage changed nothing")
				}
				r.now = r.now.Add(time.Second)
				tx := r.repairSync(b.table)
				if isFull(&tx) {
					t.Errorf("repaired by a full sync:\n%s", tx.String())
				}
				if got := tx.Tables(); !slices.Equal(got, []string{b.table}) {
					t.Errorf("repair touches tables %v, want only %s:\n%s", got, b.table, tx.String())
				}
				if d := cmp.Diff(fresh, r.dump()); d != "" {
					t.Errorf("after the repair (-fresh full sync +got):\n%s", d)
				}
				// The bookkeeping is still what the kernel holds: a change
				// applies, and a full sync afterwards finds nothing amiss.
				web := fixtures.SPName("web-clusterip", "http", model.TCP)
				if f == model.IPv6 {
					web = fixtures.SPName("dual-stack", "http", model.TCP)
				}
				r.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{web: r.state.Endpoints[web][:1]}})
				r.now = r.now.Add(time.Second)
				r.mustSync(false)
				r.now = r.now.Add(2 * time.Second)
				r.mustSync(false) // the clean-up
				r.mustSync(true)
				r.now = r.now.Add(2 * time.Second)
				r.mustSync(false) // what the change left stale goes
				if d := cmp.Diff(r.freshDump(), r.dump()); d != "" {
					t.Errorf("full sync after repair and change (-want +got):\n%s", d)
				}
			})
		}
	}
}

// TestRepairAfterPartialSyncs: with partial syncs' leftovers in the
// kernel (shadowed rules, plain ports in higher tiers, endpoint keys and
// hairpin pairs waiting for a clean-up), a repaired table holds what a
// twin that was never broken holds once both have run their clean-up.
func TestRepairAfterPartialSyncs(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	for _, table := range []string{"kube-proxy", "kube-proxy-s0", "kube-proxy-s1", "kube-proxy-s2", "kube-proxy-s3"} {
		t.Run(table, func(t *testing.T) {
			rigs := []*proxierRig{newProxierRig(t, c, model.IPv4), newProxierRig(t, c, model.IPv4)}
			for _, r := range rigs {
				r.mustSync(true)
				// Every service port loses an endpoint, then one more
				// loses another, without a clean-up in between.
				for i, n := range r.state.SortedNames() {
					if eps := r.state.Endpoints[n]; len(eps) > 1 {
						r.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{n: eps[:len(eps)-1]}})
					}
					if i%3 == 0 {
						r.now = r.now.Add(100 * time.Millisecond)
						r.mustSync(false)
					}
				}
				r.now = r.now.Add(100 * time.Millisecond)
				r.mustSync(false)
				if !(len(r.p.applied.plainPorts.settle) > 0) && len(r.p.applied.rewrite) == 0 {
					t.Fatal("no partial-sync leftovers to repair around")
				}
			}
			broken, twin := rigs[0], rigs[1]
			if err := broken.fake.DeleteTable(context.Background(), broken.family(), table); err != nil {
				t.Fatal(err)
			}
			broken.now = broken.now.Add(100 * time.Millisecond)
			tx := broken.repairSync(table)
			if got := tx.Tables(); !slices.Equal(got, []string{table}) {
				t.Errorf("repair touches tables %v, want only %s", got, table)
			}
			for _, r := range rigs {
				r.now = r.now.Add(2 * time.Second)
				r.mustSync(false) // the clean-up, which must apply
				if a := r.lastApply(); a.Err != nil {
					t.Fatalf("clean-up failed: %v", a.Err)
				}
			}
			if d := cmp.Diff(twin.dump(), broken.dump()); d != "" {
				t.Errorf("repaired kernel after the clean-up (-never broken +repaired):\n%s", d)
			}
		})
	}
}

// TestRepairFallsBackToFullSync: what a repair cannot be sure of is
// repaired by a full sync.
func TestRepairFallsBackToFullSync(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	for _, tc := range []struct {
		name  string
		table string
		// change makes the state differ from what was applied.
		change func(r *proxierRig) string
	}{{
		name:  "not one of our tables",
		table: "kube-proxy-s7",
	}, {
		name:  "a service port with chains in the table changed",
		table: "kube-proxy-s0",
		change: func(r *proxierRig) string {
			// Marked changed without a change: the repair cannot know
			// that its chains are the same.
			for _, n := range r.state.SortedNames() {
				if s := r.p.applied.services[n]; len(s.chains) > 0 && s.table == "kube-proxy-s0" {
					r.pending.Insert(n)
					return n.String()
				}
			}
			return ""
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newProxierRig(t, c, model.IPv4)
			r.mustSync(true)
			fresh := r.freshDump()
			if err := r.fake.DeleteTable(context.Background(), r.family(), "kube-proxy-s0"); err != nil {
				t.Fatal(err)
			}
			if tc.change != nil && tc.change(r) == "" {
				t.Fatal("no service port with chains in kube-proxy-s0")
			}
			r.now = r.now.Add(time.Second)
			tx := r.repairSync(tc.table)
			if !isFull(&tx) {
				t.Errorf("want a full sync, got:\n%s", tx.String())
			}
			if d := cmp.Diff(fresh, r.dump()); d != "" {
				t.Errorf("after the full sync (-want +got):\n%s", d)
			}
		})
	}
}

// TestRepairFailureMakesNextSyncFull: a repair the kernel refuses fails
// the sync; the next one is full.
func TestRepairFailureMakesNextSyncFull(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	r := newProxierRig(t, c, model.IPv4)
	r.mustSync(true)
	// A table re-created empty by another program is deleted and
	// written again.
	if err := r.fake.DeleteTable(context.Background(), r.family(), "kube-proxy-s1"); err != nil {
		t.Fatal(err)
	}
	foreignTx(t, r, "kube-proxy-s1", func(w nft.TableOps) {
		w.Add(&nft.Table{Family: r.family(), Name: "kube-proxy-s1"})
	})
	r.p.RepairTables([]string{"kube-proxy-s1"})
	// The repair deletes the foreign table and writes it again: fine.
	r.mustSync(false)
	if d := cmp.Diff(r.freshDump(), r.dump()); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
	r.fake.BeforeApply = func(tx *nft.Transaction) error {
		if strings.Contains(tx.String(), "kube-proxy-s1") {
			return &nft.OpError{Index: -1, Err: unix.ENOMEM, Message: "out of memory"}
		}
		return nil
	}
	r.p.RepairTables([]string{"kube-proxy-s1"})
	if _, err := r.sync(false); err == nil {
		t.Fatal("the refused repair did not fail the sync")
	}
	r.fake.BeforeApply = nil
	r.mustSync(false)
	if a := r.lastApply(); !isFull(a.Tx) {
		t.Errorf("the sync after a failed repair is not full:\n%s", a.Tx)
	}
}

// TestRepairOfMainTableDoesNotGrowWithEndpoints: the main table holds
// nothing per endpoint (the hairpin pairs are the shards', by address),
// so re-creating it writes as much after endpoints with new addresses
// are added as before; each new pair is written by the repair of the
// shard hairpinShard gives it, and by no other.
func TestRepairOfMainTableDoesNotGrowWithEndpoints(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	r := newProxierRig(t, c, model.IPv4)
	r.mustSync(true)
	repair := func(table string) nft.Transaction {
		t.Helper()
		if err := r.fake.DeleteTable(context.Background(), r.family(), table); err != nil {
			t.Fatal(err)
		}
		r.now = r.now.Add(time.Second)
		tx := r.repairSync(table)
		if isFull(&tx) {
			t.Fatalf("%s repaired by a full sync", table)
		}
		return tx
	}
	first := repair("kube-proxy")
	before := first.Len()

	web := fixtures.SPName("web-clusterip", "http", model.TCP)
	eps := slices.Clone(r.state.Endpoints[web])
	var added []netip.Addr
	for i := range 40 {
		e := *eps[0]
		e.IP = netip.AddrFrom4([4]byte{198, 18, 140, byte(i + 1)})
		eps = append(eps, &e)
		added = append(added, e.IP)
	}
	r.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{web: eps}})
	r.now = r.now.Add(time.Second)
	r.mustSync(false)
	r.now = r.now.Add(2 * time.Second)
	r.mustSync(false) // the clean-up

	mainTx := repair("kube-proxy")
	if after := mainTx.Len(); after != before {
		t.Errorf("the main table's repair has %d operations with 40 more endpoint addresses, %d before:\n%s", after, before, mainTx.String())
	}
	for _, op := range mainTx.Ops {
		if op.Element != nil && op.Element.Set == setHairpin {
			t.Errorf("the main table's repair writes a hairpin pair: %v", op.Element)
		}
	}
	shards := r.p.applied.shards
	if shards < 2 {
		t.Fatalf("the example has %d shard tables, want several", shards)
	}
	written := map[netip.Addr][]string{}
	for i := range shards {
		table := ShardTable("kube-proxy", i)
		tx := repair(table)
		for _, op := range tx.Ops {
			if op.Element != nil && op.Element.Set == setHairpin {
				written[op.Element.Key[0].Addr] = append(written[op.Element.Key[0].Addr], table)
			}
		}
	}
	for _, ip := range added {
		want := []string{ShardTable("kube-proxy", hairpinShard(ip, shards))}
		if got := written[ip]; !slices.Equal(got, want) {
			t.Errorf("hairpin pair of %s written by the repairs of %v, want %v", ip, got, want)
		}
	}
	if d := cmp.Diff(r.freshDump(), r.dump()); d != "" {
		t.Errorf("after the repairs (-fresh full sync +got):\n%s", d)
	}
	// An added endpoint reaching its own service is masqueraded exactly
	// when it lands on itself.
	src := added[6]
	res, err := r.rules().Trace(trace.Packet{Src: src, SrcPort: 40000, Dst: netip.MustParseAddr("198.19.0.10"), DstPort: 80, Proto: v1.ProtocolTCP, IIF: podIIF}, hostA)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Outcomes) != len(eps) {
		t.Fatalf("want one outcome per endpoint (%d), got:\n%s", len(eps), res)
	}
	for _, o := range res.Outcomes {
		if o.DNAT == nil || o.Masquerade != (o.DNAT.Addr() == src) {
			t.Errorf("%s: masquerade=%v, want it only to the source itself\n%s", o.Summary(), o.Masquerade, res)
		}
	}
}

// TestFullSyncDropsMainTableHairpinSet: a main table written by a version
// that kept the hairpin pairs there (set and masquerading rule) loses
// both at a restart's first full sync (takeOver: an unknown set goes once
// the chains are flushed); the pairs are the shards'.
func TestFullSyncDropsMainTableHairpinSet(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	r := newProxierRig(t, c, model.IPv4)
	r.mustSync(true)
	fresh := r.freshDump()
	pair := []nft.Value{{Addr: netip.MustParseAddr("198.18.129.10")}, {Addr: netip.MustParseAddr("198.18.129.10")}}
	foreignTx(t, r, "kube-proxy", func(w nft.TableOps) {
		w.Add(&nft.Set{Name: setHairpin, Key: []nft.DataType{nft.TypeIPv4Addr, nft.TypeIPv4Addr}, Comment: hairpinComment})
		w.Add(&nft.Element{Set: setHairpin, Key: pair})
		w.AddRules(&nft.Rule{Chain: chainMasquerading, Stmts: []nft.Stmt{
			nft.MatchInSet{Fields: []nft.Field{nft.FieldSaddr, nft.FieldDaddr}, Set: setHairpin}, nft.SetMarkOr{Mask: r.p.cfg.markMask()}}})
	})
	if !strings.Contains(r.dump(), "add set ip kube-proxy hairpin-endpoints ") {
		t.Fatalf("the older layout was not written:\n%s", r.dump())
	}
	r.p = r.newProxier()
	r.mustSync(true)
	if d := cmp.Diff(fresh, r.dump()); d != "" {
		t.Errorf("after the restart's full sync (-fresh full sync +got):\n%s", d)
	}
}
