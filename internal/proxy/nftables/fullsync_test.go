package nftables

// Full syncs over what the kernel already holds, pure (Render and Commit,
// through the syncer of syncer_test.go). The address plan is at the top
// of fixtures_test.go.

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
	"github.com/kproxy/kproxy/internal/testutil/fixtures"
)

// TestFullSyncOverExistingTable: a full sync over a table that already
// holds our rules (every sync period in the same process, or a restart with
// a fresh Applied) rewrites the fixed chains and maps without ever
// scheduling them for deletion, and turns leftovers into stale objects:
// leftover chains are emptied in the sync's transaction (so that a service
// reusing one finds no old rules that use sets it cannot know the owner
// of) and deleted, with leftover sets, by a later clean-up.
func TestFullSyncOverExistingTable(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	// A service port with chains of its own (see plain_test.go for the
	// chains plain ports share).
	gone := fixtures.SPName("web-nodeport", "http", model.TCP)
	for _, tc := range []struct {
		name    string
		restart bool
	}{
		{"same process", false},
		{"restart", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSyncer(t, c, model.IPv4)
			s.full()
			leftovers := []string{serviceChainName(prefixServiceChain, gone), serviceChainName(prefixExternalChain, gone)}
			// The service goes away while no sync runs (a restart, or
			// a change folded into the periodic full sync).
			delete(s.state.Services, gone)
			delete(s.state.Endpoints, gone)
			if tc.restart {
				s.applied = NewApplied()
			}
			s.now = s.now.Add(time.Minute)
			p := s.full()
			fixed := sets.New(fixedNames(s.cfg)...)
			var flushedLeftovers []string
			for i, op := range opTexts(p) {
				f := strings.Fields(op)
				if len(f) < 5 {
					continue
				}
				name := f[4]
				if f[0] == "delete" && (f[1] == "chain" || f[1] == "set" || f[1] == "map") {
					t.Errorf("op %d: a full sync deletes at once: %s", i, op)
				}
				if f[0] == "flush" && f[1] == "chain" && slices.Contains(leftovers, name) {
					flushedLeftovers = append(flushedLeftovers, name)
				}
				// A fixed chain or map is only flushed before it is
				// filled: never after one of its rules or elements.
				if f[0] == "flush" && fixed.Has(name) {
					for _, prev := range opTexts(p)[:i] {
						if strings.HasPrefix(prev, "add rule ip "+f[3]+" "+name+" ") || strings.HasPrefix(prev, "add element ip "+f[3]+" "+name+" ") {
							t.Fatalf("op %d flushes %s after it was filled: %s", i, name, op)
						}
					}
				}
			}
			slices.Sort(flushedLeftovers)
			if diff := cmp.Diff(slices.Sorted(slices.Values(leftovers)), flushedLeftovers); diff != "" {
				t.Errorf("leftover chains flushed in the sync transaction (-want +got):\n%s", diff)
			}
			if p.Cleanup != nil {
				t.Errorf("leftovers found now are cleaned up at once:\n%s", p.Cleanup)
			}
			s.checkLikeFull("full sync over the old table")
			runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
				{name: "source ranges still enforced", src: outsideDenied, iif: lanIIF, dst: "198.19.200.1:443", output: "DROP"},
				{name: "removed service gone", src: localPod, iif: podIIF, dst: "198.19.0.11:80", output: "ACCEPT"},
			})
			// The next full sync, one second later, deletes exactly the
			// leftovers in its clean-up transaction, and it loads (nothing
			// in use is deleted).
			s.now = s.now.Add(staleDelay)
			cp := s.partial()
			if cp.Tx.Len() != 0 {
				t.Errorf("a partial sync after the delay: want only a clean-up, got:\n%s", cp.Tx)
			}
			if cp.Cleanup == nil {
				t.Fatal("no clean-up transaction after the stale delay")
			}
			var deleted []string
			for _, op := range strings.Split(strings.TrimSpace(cp.Cleanup.String()), "\n") {
				f := strings.Fields(op)
				if f[0] == "flush" {
					continue
				}
				if f[0] != "delete" {
					t.Errorf("stale cleanup: unexpected %s", op)
					continue
				}
				deleted = append(deleted, f[4])
			}
			slices.Sort(deleted)
			// The service's endpoint map, which only it used, goes too
			// (the full sync emptied it with the others).
			want := append(slices.Clone(leftovers), endpointMapName(gone))
			slices.Sort(want)
			if diff := cmp.Diff(want, deleted); diff != "" {
				t.Errorf("deleted after the stale delay (-want +got):\n%s", diff)
			}
			s.now = s.now.Add(time.Hour)
			if p := s.partial(); p.Tx.Len() != 0 {
				t.Errorf("after cleanup: want no operations, got:\n%s", p.Tx)
			}
			s.checkLikeFull("after cleanup")
		})
	}
}

// TestHairpinPairBackAtFullSync: an endpoint whose hairpin pair became
// garbage in a partial sync, and that a full sync brings back, keeps its
// pair: the full sync flushed the set, so it must add the pair again.
func TestHairpinPairBackAtFullSync(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	s := newSyncer(t, c, model.IPv4)
	s.full()
	sp := fixtures.ServicePort("hp", "198.19.1.50", 80, nil)
	ep := fixtures.Endpoint("198.18.129.150", 8080, true, nil)
	s.apply(&model.FamilyDelta{Services: map[model.ServicePortName]*model.ServicePort{sp.Name: sp}, Endpoints: map[model.ServicePortName][]*model.Endpoint{sp.Name: {ep}}})
	// The endpoint goes: its pair is garbage, still in the kernel.
	s.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{sp.Name: nil}})
	// It comes back, picked up by a full sync.
	s.state.Endpoints[sp.Name] = []*model.Endpoint{ep}
	s.full()
	if !strings.Contains(s.rs.String(), "198.18.129.150 . 198.18.129.150") {
		t.Errorf("hairpin pair missing after the full sync:\n%s", s.rs.String())
	}
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "pod to itself through its service", src: "198.18.129.150", iif: podIIF, dst: "198.19.1.50:80", output: "198.18.129.150:8080", masq: true},
	})
}
