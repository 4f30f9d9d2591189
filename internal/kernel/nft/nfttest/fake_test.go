package nfttest

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

func newBaseFake(t *testing.T) *Fake {
	t.Helper()
	f := New()
	if err := f.Apply(context.Background(), baseTx()); err != nil {
		t.Fatalf("base state: %v", err)
	}
	f.ResetApplies()
	return f
}

func TestFakeRejectsWhatTheKernelRejects(t *testing.T) {
	for _, c := range fakeCases {
		t.Run(c.name, func(t *testing.T) {
			f := newBaseFake(t)
			before := f.Dump()
			tx := nft.NewTransaction(nft.IPv4, tbl)
			c.build(tx)
			err := f.Apply(context.Background(), tx)
			if c.errno == 0 {
				if err != nil {
					t.Fatalf("Apply: %v\n%s", err, tx)
				}
				return
			}
			if !errors.Is(err, c.errno) {
				t.Fatalf("got %v, want %v", err, c.errno)
			}
			var oe *nft.OpError
			if !errors.As(err, &oe) {
				t.Fatalf("%v is not an *nft.OpError", err)
			}
			if c.checkIndex && (oe.Index != c.index || oe.Op != tx.OpText(c.index)) {
				t.Errorf("error names operation %d %q, want %d %q", oe.Index, oe.Op, c.index, tx.OpText(c.index))
			}
			if !strings.Contains(err.Error(), "not applied") {
				t.Errorf("error %q does not say the transaction was not applied", err)
			}
			// Atomicity: nothing of the failed transaction is left.
			if d := cmp.Diff(before, f.Dump()); d != "" {
				t.Errorf("state changed by a failed transaction (-before +after):\n%s", d)
			}
			if a := f.Applies(); len(a) != 1 || a[0].Err == nil || a[0].Ops != tx.Len() {
				t.Errorf("Applies() = %+v, want one failed apply of %d ops", a, tx.Len())
			}
			if f.OpsApplied() != 0 {
				t.Errorf("OpsApplied() = %d after a failure, want 0", f.OpsApplied())
			}
		})
	}
}

func TestFakeKeepsFirstComments(t *testing.T) {
	f := newBaseFake(t)
	tx := nft.NewTransaction(nft.IPv4, tbl)
	tx.Add(&nft.Table{Comment: "other"})
	tx.Add(&nft.Chain{Name: "svc", Comment: "other"})
	tx.Add(&nft.Set{Name: "ips", Key: []nft.DataType{nft.TypeIPv4Addr}, Comment: "other"})
	tx.Add(&nft.Element{Set: "ranges", Key: []nft.Value{pfx("10.0.0.0/16")}, Comment: "other"})
	if err := f.Apply(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	dump := f.Dump()
	if strings.Contains(dump, `"other"`) {
		t.Errorf("re-adding objects replaced their comments, as the kernel does not:\n%s", dump)
	}
}

func TestFakeDump(t *testing.T) {
	f := New()
	ctx := context.Background()
	// Objects added in a scrambled order come out sorted.
	tx := nft.NewTransaction(nft.IPv6, "z")
	tx.Add(&nft.Table{})
	tx.Add(&nft.Chain{Name: "b"}, &nft.Chain{Name: "a", Type: nft.TypeFilter, Hook: nft.HookInput, Priority: -10})
	tx.Add(&nft.Set{Name: "s", Key: []nft.DataType{nft.TypeIPv6Addr}})
	tx.Add(&nft.Rule{Chain: "b", Stmts: []nft.Stmt{nft.Counter{}}, Comment: "first"})
	tx.Add(&nft.Rule{Chain: "a", Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Jump, Chain: "b"}}})
	tx.Add(&nft.Rule{Chain: "b", Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Drop}}})
	for _, a := range []string{"fd00::10", "fd00::9", "fd00::a"} {
		tx.Add(&nft.Element{Set: "s", Key: []nft.Value{{Addr: netip.MustParseAddr(a)}}})
	}
	if err := f.Apply(ctx, tx); err != nil {
		t.Fatal(err)
	}
	tx = nft.NewTransaction(nft.IPv4, "y")
	tx.Add(&nft.Table{Comment: "ip table"})
	tx.Add(&nft.Set{Name: "m", Key: []nft.DataType{nft.TypeInetProto, nft.TypeInetService}, Data: nft.TypeVerdict})
	tx.Add(&nft.Element{Set: "m", Key: []nft.Value{{Proto: v1.ProtocolUDP}, {Port: 53}}, Verdict: &nft.Verdict{Kind: nft.Accept}})
	tx.Add(&nft.Element{Set: "m", Key: []nft.Value{{Proto: v1.ProtocolTCP}, {Port: 8080}}, Verdict: &nft.Verdict{Kind: nft.Drop}, Comment: "c"})
	tx.Add(&nft.Element{Set: "m", Key: []nft.Value{{Proto: v1.ProtocolTCP}, {Port: 443}}, Verdict: &nft.Verdict{Kind: nft.Accept}})
	if err := f.Apply(ctx, tx); err != nil {
		t.Fatal(err)
	}
	want := `add table ip y { comment "ip table" ; }
add map ip y m { type inet_proto . inet_service : verdict ; }
add element ip y m { tcp . 443 : accept }
add element ip y m { tcp . 8080 comment "c" : drop }
add element ip y m { udp . 53 : accept }
add table ip6 z
add chain ip6 z a { type filter hook input priority -10 ; }
add chain ip6 z b
add set ip6 z s { type ipv6_addr ; }
add rule ip6 z a jump b
add rule ip6 z b counter comment "first"
add rule ip6 z b drop
add element ip6 z s { fd00::9 }
add element ip6 z s { fd00::a }
add element ip6 z s { fd00::10 }
`
	if d := cmp.Diff(want, f.Dump()); d != "" {
		t.Errorf("Dump (-want +got):\n%s", d)
	}
	if got := f.DumpTable(nft.IPv4, "y"); !strings.HasPrefix(want, got) {
		t.Errorf("DumpTable(ip, y) = %q", got)
	}

	// Loading the dump into a new fake reproduces it.
	g := New()
	if err := g.Load(f.Dump()); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(f.Dump(), g.Dump()); d != "" {
		t.Errorf("Load(Dump()) (-original +loaded):\n%s", d)
	}
}

func TestFakeLoadReproducesBase(t *testing.T) {
	f := newBaseFake(t)
	g := New()
	if err := g.Load(f.Dump()); err != nil {
		t.Fatalf("Load: %v\n%s", err, f.Dump())
	}
	if d := cmp.Diff(f.Dump(), g.Dump()); d != "" {
		t.Errorf("(-original +loaded):\n%s", d)
	}
}

func TestFakeApplyRecords(t *testing.T) {
	f := newBaseFake(t)
	ctx := context.Background()
	if err := f.Apply(ctx, nft.NewTransaction(nft.IPv4, tbl)); err != nil {
		t.Fatal(err)
	}
	if n := f.OpsApplied(); n != 0 {
		t.Errorf("an empty transaction counted %d ops", n)
	}
	tx := nft.NewTransaction(nft.IPv4, tbl)
	tx.Add(el("ips", []nft.Value{{Addr: svc2}}, nil))
	tx.Delete(el("ips", []nft.Value{{Addr: svc1}}, nil))
	if err := f.Apply(ctx, tx); err != nil {
		t.Fatal(err)
	}
	injected := errors.New("injected")
	f.BeforeApply = func(*nft.Transaction) error { return injected }
	if err := f.Apply(ctx, tx); !errors.Is(err, injected) {
		t.Errorf("BeforeApply error not returned: %v", err)
	}
	got := f.Applies()
	if len(got) != 3 || got[0].Ops != 0 || got[1].Ops != 2 || got[1].Err != nil || !errors.Is(got[2].Err, injected) {
		t.Errorf("Applies() = %+v", got)
	}
	if n := f.OpsApplied(); n != 2 {
		t.Errorf("OpsApplied() = %d, want 2", n)
	}
	f.ResetApplies()
	if len(f.Applies()) != 0 {
		t.Errorf("ResetApplies did not forget")
	}
}

func TestFakeListings(t *testing.T) {
	f := newBaseFake(t)
	ctx := context.Background()
	chains, err := f.ListChains(ctx, nft.IPv4, tbl)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"ep", "filter-input", "masq", "nat-postrouting", "nat-prerouting", "services", "svc", "unused", "via-map"}
	if d := cmp.Diff(want, chains); d != "" {
		t.Errorf("ListChains (-want +got):\n%s", d)
	}
	sets, err := f.ListSets(ctx, nft.IPv4, tbl)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"aff", "ips", "nodeports", "ranges", "svcmap", "tmap"}, sets); d != "" {
		t.Errorf("ListSets (-want +got):\n%s", d)
	}
	if _, err := f.ListSets(ctx, nft.IPv6, tbl); !errors.Is(err, nft.ErrNotFound) {
		t.Errorf("ListSets of a missing table: %v", err)
	}
	def, rules := f.Chain(nft.IPv4, tbl, "ep")
	if def == nil || len(rules) != 2 {
		t.Errorf("Chain(ep) = %v, %d rules", def, len(rules))
	}
	sdef, elems := f.Set(nft.IPv4, tbl, "svcmap")
	if sdef == nil || len(elems) != 1 || elems[0].Verdict.Chain != "svc" {
		t.Errorf("Set(svcmap) = %v, %v", sdef, elems)
	}
	if ok, _ := f.TableExists(ctx, nft.IPv4, tbl); !ok {
		t.Errorf("TableExists = false")
	}
	if err := f.DeleteTable(ctx, nft.IPv4, tbl); err != nil {
		t.Fatal(err)
	}
	if err := f.DeleteTable(ctx, nft.IPv4, tbl); err != nil {
		t.Errorf("deleting a missing table: %v", err)
	}
	if ok, _ := f.TableExists(ctx, nft.IPv4, tbl); ok {
		t.Errorf("TableExists after DeleteTable")
	}
	tx := nft.NewTransaction(nft.IPv4, tbl)
	tx.Add(&nft.Chain{Name: "c"})
	if err := f.Apply(ctx, tx); !errors.Is(err, unix.ENOENT) {
		t.Errorf("chain in a missing table: %v, want ENOENT", err)
	}
}
