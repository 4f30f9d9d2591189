package nftables

// Packet-flow tests: the shared table of package flowtest (the address
// plan is at the top of its snapshot.go), rendered by this package and
// followed through the nft tracer.

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/kernel/nft/nfttest"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
	"github.com/kproxy/kproxy/internal/testutil/fixtures"
	nfttrace "github.com/kproxy/kproxy/internal/trace/nftables"
)

// flowAdapter is nftables mode's flowtest.Adapter: a full sync of both
// families on a fresh node, with the golden files' options (exampleOptions)
// changed by the snapshot's configuration, applied to nfttest's fake
// nf_tables; the tracer walks the fake's state (no second kernel).
func flowAdapter(t testing.TB, s *flowtest.Snapshot) flowtest.Tracer {
	t.Helper()
	fake := nfttest.New()
	for _, f := range flowtest.Families {
		o := flowOptions(f, s.Config)
		in := &Input{RenderInput: proxy.RenderInput{State: s.States[f], NodeName: s.Node.Name, Zone: s.Node.Zone(), Changed: sets.New[model.ServicePortName]()}, Full: true}
		p := Render(o.RenderConfig(s.Node, s.LocalAddrs), in, NewApplied())
		if len(p.Conflicts) > 0 {
			t.Fatalf("unexpected conflicts: %v", p.Conflicts)
		}
		if err := fake.Apply(context.Background(), p.Tx); err != nil {
			t.Fatalf("full sync of %s refused: %v", f, err)
		}
	}
	return nfttrace.Of(fake.State())
}

// flowOptions are exampleOptions with a flowtest configuration.
func flowOptions(f v1.IPFamily, c flowtest.Config) Options {
	o := exampleOptions(f)
	o.MasqueradeAll = c.MasqueradeAll
	o.LocalDetect = c.LocalDetect(f)
	o.NodePortAddresses = c.NodePortAddresses
	o.ServiceCIDRs = model.PrefixesOf(c.ServiceCIDRs, f)
	// c.NoLocalhostNodePorts: nftables mode never serves node ports on
	// loopback, as upstream.
	return o
}

func TestPacketFlow(t *testing.T) {
	flowtest.Run(t, flowtest.NFTables, flowAdapter)
}

// TestNoLocalTallyETPLocal: a Local external policy whose endpoints are
// all elsewhere (the table's "ETP Local without local endpoints") is
// counted by the sync as Local without local endpoints.
func TestNoLocalTallyETPLocal(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	s := &flowtest.Snapshot{Node: c.Node, States: c.States}
	flowtest.OnlyRemoteEndpoints(t, s, fixtures.SPName("etp-local", "http", model.TCP), 1)
	a := NewApplied()
	renderFull(t, c, exampleOptions(model.IPv4)).Commit(a)
	if internal, external := a.NoLocal(); internal != 0 || external != 1 {
		t.Errorf("NoLocal() = %d internal, %d external; want 0, 1", internal, external)
	}
}
