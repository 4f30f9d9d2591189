package nftables

// Shard tests: names, the choice of the shard count, and shard tables
// added and removed as the count changes. Address plan: fixtures_test.go.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
	"github.com/kproxy/kproxy/internal/testutil/fixtures"
)

func TestShardNames(t *testing.T) {
	for _, tc := range []struct {
		table string
		index int
		ok    bool
	}{
		{"kube-proxy-s0", 0, true},
		{"kube-proxy-s17", 17, true},
		{"kube-proxy", 0, false},
		{"kube-proxy-s", 0, false},
		{"kube-proxy-s01", 0, false},
		{"kube-proxy-s-1", 0, false},
		{"kube-proxy-sx", 0, false},
		{"kube-proxy-s1x", 0, false},
		{"other-s1", 0, false},
		{"kube-proxy-s1234567", 0, false},
	} {
		i, ok := ShardIndex("kube-proxy", tc.table)
		if i != tc.index || ok != tc.ok {
			t.Errorf("ShardIndex(%q) = %d, %v; want %d, %v", tc.table, i, ok, tc.index, tc.ok)
		}
		if ok && ShardTable("kube-proxy", i) != tc.table {
			t.Errorf("ShardTable(%d) = %q, want %q", i, ShardTable("kube-proxy", i), tc.table)
		}
	}
	got := OurTables("kube-proxy", []string{"filter", "kube-proxy", "kube-proxy-s0", "kube-proxy-s3", "kube-proxy-sx", "kube-proxy2", "nat"})
	if diff := cmp.Diff([]string{"kube-proxy", "kube-proxy-s0", "kube-proxy-s3"}, got); diff != "" {
		t.Errorf("OurTables (-want +got):\n%s", diff)
	}
}

func TestShardOfIsStableAndSpread(t *testing.T) {
	// The hash must never change: an upgrade would move every service.
	n := fixtures.SPName("web", "http", model.TCP)
	if h := shardHash(n); h != 0x8fb4139c {
		t.Errorf("shardHash(%s) = %#08x; the shard hash changed", n, h)
	}
	// 4096 services over 16 shards: every shard gets 256 ± 25 %.
	count := make([]int, 16)
	for i := range 4096 {
		count[ShardOf(fixtures.SPName(fmt.Sprintf("svc-%d", i), "http", model.TCP), 16)]++
	}
	for i, c := range count {
		if c < 192 || c > 320 {
			t.Errorf("shard %d holds %d of 4096 services (want 192-320): %v", i, c, count)
		}
	}
	if ShardOf(n, 1) != 0 || ShardOf(n, 0) != 0 {
		t.Errorf("one shard: ShardOf must be 0")
	}
}

func TestChooseShards(t *testing.T) {
	for _, tc := range []struct {
		n, cur, per, want int
	}{
		{0, 0, 0, 1},
		{1000, 0, 0, 1},
		{1025, 0, 0, 2},
		{10000, 0, 0, 16},
		{50000, 0, 0, 64},
		{14, 0, 4, 4},
		// Hysteresis: kept between perShard/4 and 2*perShard per shard.
		{2048, 1, 0, 1},
		{2049, 1, 0, 4},
		{10000, 16, 0, 16},
		{4096, 16, 0, 16},
		{4095, 16, 0, 4},
		{32768, 16, 0, 16},
		{32769, 16, 0, 64},
		{0, 16, 0, 1},
		{3, 16, 1, 4},
	} {
		if got := chooseShards(tc.n, tc.cur, tc.per); got != tc.want {
			t.Errorf("chooseShards(%d, %d, %d) = %d, want %d", tc.n, tc.cur, tc.per, got, tc.want)
		}
	}
}

// tablesOf lists the tables a ruleset holds, from its text.
func tablesOf(text string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if f := strings.Fields(l); len(f) >= 4 && f[0] == "add" && f[1] == "table" {
			out = append(out, f[3])
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// TestShardCountChanges: a full sync with another shard size moves
// services between shards in one transaction that deletes the shard
// tables beyond the new count; traffic is the same at every step, and
// once stale objects are cleaned up the tables are those of a fresh node.
func TestShardCountChanges(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	s := newSyncer(t, c, model.IPv4)
	s.full() // 14 service ports, 4 per shard: 4 shards
	if s.applied.shards != 4 {
		t.Fatalf("shards = %d, want 4", s.applied.shards)
	}
	for _, tc := range []struct {
		perShard    int
		shards      int
		deleted     []string
		tablesAfter int
	}{
		{1, 16, nil, 17},
		{16, 1, []string{"kube-proxy-s1", "kube-proxy-s10", "kube-proxy-s11", "kube-proxy-s12", "kube-proxy-s13", "kube-proxy-s14", "kube-proxy-s15",
			"kube-proxy-s2", "kube-proxy-s3", "kube-proxy-s4", "kube-proxy-s5", "kube-proxy-s6", "kube-proxy-s7", "kube-proxy-s8", "kube-proxy-s9"}, 2},
		{4, 4, nil, 5},
	} {
		s.cfg.ServicesPerShard = tc.perShard
		s.now = s.now.Add(time.Minute)
		p := s.full()
		if s.applied.shards != tc.shards {
			t.Fatalf("per shard %d: shards = %d, want %d", tc.perShard, s.applied.shards, tc.shards)
		}
		var deleted []string
		for _, op := range opTexts(p) {
			if f := strings.Fields(op); f[0] == "delete" && f[1] == "table" {
				deleted = append(deleted, f[3])
			}
		}
		if diff := cmp.Diff(tc.deleted, deleted); diff != "" {
			t.Errorf("per shard %d: tables deleted (-want +got):\n%s", tc.perShard, diff)
		}
		if got := tablesOf(s.rs.String()); len(got) != tc.tablesAfter {
			t.Errorf("per shard %d: tables %v, want %d", tc.perShard, got, tc.tablesAfter)
		}
		s.checkLikeFull(fmt.Sprintf("%d per shard", tc.perShard))
		// Services left behind in shards that stay are cleaned up later.
		s.now = s.now.Add(staleDelay)
		s.partial()
		fa := NewApplied()
		fa.shards = s.applied.shards
		fresh := parse(t, Render(s.cfg, s.input(true, nil), fa).Tx.String())
		if diff := cmp.Diff(contents(fresh), contents(s.rs)); diff != "" {
			t.Errorf("per shard %d: after clean-up the tables differ from a full render (-full +synced):\n%s", tc.perShard, diff)
		}
	}
}

// TestPartialSyncTouchesOneShard: a change of one service writes to its
// shard table (and the main table's plain sets), never to other shards:
// the kernel validates only the tables a transaction touches.
func TestPartialSyncTouchesOneShard(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	s := newSyncer(t, c, model.IPv4)
	s.full()
	for _, n := range s.state.SortedNames() {
		eps := s.state.Endpoints[n]
		if len(eps) == 0 {
			continue
		}
		e := *eps[0]
		e.Port++
		s.now = s.now.Add(10 * time.Millisecond)
		p := s.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{n: append([]*model.Endpoint{&e}, eps[1:]...)}})
		tables := sets.New[string]()
		for i := range p.Tx.Ops {
			op := &p.Tx.Ops[i]
			tables.Insert(p.Tx.TableOf(op))
			if p.Tx.TableOf(op) == s.cfg.table() && op.Rule != nil {
				t.Errorf("%s: rule written in the main table: %s", n, p.Tx.OpText(i))
			}
		}
		tables.Delete(s.cfg.table())
		if want := s.shardOf(n); !tables.Equal(sets.New(want)) {
			t.Errorf("%s: endpoint change touched tables %v, want only %s", n, sets.List(tables), want)
		}
	}
	s.checkLikeFull("after all changes")
}

// TestProxierShrinkRemovesShardTables: the proxier deletes shard tables it
// no longer uses, and a restart with fewer services picks a smaller count.
func TestProxierShrinkRemovesShardTables(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	r := newProxierRig(t, c, model.IPv4)
	r.mustSync(true)
	list := func() []string {
		tables, err := r.fake.ListTables(context.Background(), nft.IPv4)
		if err != nil {
			t.Fatal(err)
		}
		return tables
	}
	if got := list(); len(got) != 5 {
		t.Fatalf("tables %v, want the main one and 4 shards", got)
	}
	// Most services go away: a restart (fresh proxier, same kernel) picks
	// one shard and deletes the others.
	d := &model.FamilyDelta{Services: map[model.ServicePortName]*model.ServicePort{}}
	for i, n := range r.state.SortedNames() {
		if i >= 3 {
			d.Services[n] = nil
		}
	}
	r.apply(d)
	r.p = r.newProxier()
	r.now = r.now.Add(time.Minute)
	r.mustSync(false)
	if diff := cmp.Diff([]string{"kube-proxy", "kube-proxy-s0"}, list()); diff != "" {
		t.Errorf("tables after the shrink (-want +got):\n%s", diff)
	}
	r.now = r.now.Add(time.Minute)
	r.mustSync(false)
	if diff := cmp.Diff(r.freshDump(), r.dump()); diff != "" {
		t.Errorf("after the shrink and clean-up (-fresh +got):\n%s", diff)
	}
}
