package iptables

// Packet-flow tests: the shared table of package flowtest (the address
// plan is at the top of its snapshot.go), rendered by this package,
// restored into the iptables tracer (which refuses what iptables-restore
// and the kernel would), and followed through it, in upstream's layout and
// in the compact one: both must route every packet alike.

import (
	"errors"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
	"github.com/kproxy/kproxy/internal/trace"
	iptrace "github.com/kproxy/kproxy/internal/trace/iptables"
)

// rulesets are one tracer ruleset per family: the flowtest.Tracer of
// iptables mode.
type rulesets map[v1.IPFamily]*iptrace.Ruleset

func (rs rulesets) Trace(p trace.Packet, h trace.Host) (*trace.Result, error) {
	return rs[model.FamilyOf(p.Dst)].Trace(p, h)
}

// Remember goes to the ruleset of the family the connection was DNATed
// in: affinity is recorded by the DNAT rule.
func (rs rulesets) Remember(o trace.Outcome) error {
	if o.DNAT == nil {
		return errors.New("an outcome without DNAT records no affinity")
	}
	return rs[model.FamilyOf(o.DNAT.Addr())].Remember(o)
}

// flowAdapter is iptables mode's flowtest.Adapter for one layout: a full
// sync of both families on a fresh node, with the golden files' options
// (exampleOptions) changed by the snapshot's configuration, restored into
// fresh tracer rulesets with route_localnet as the proxier's caller sets
// it for localhost node ports.
func flowAdapter(compact bool) flowtest.Adapter {
	return func(t testing.TB, s *flowtest.Snapshot) flowtest.Tracer {
		t.Helper()
		out := rulesets{}
		for _, f := range flowtest.Families {
			o := flowOptions(f, s.Config)
			o.CompactLayout = compact
			in := &Input{RenderInput: proxy.RenderInput{State: s.States[f], NodeName: s.Node.Name, Zone: s.Node.Zone(), Changed: sets.New[model.ServicePortName]()}, Full: true, Existing: &Existing{}}
			plan := Render(o.RenderConfig(s.Node, s.LocalAddrs), in, NewApplied())
			rs := &iptrace.Ruleset{RouteLocalnet: f == model.IPv4 && o.LocalhostNodePorts}
			for i, r := range plan.Restores {
				if err := rs.Apply(r, true); err != nil {
					t.Fatalf("%s restore %d does not load: %v\n%s", f, i+1, err, r)
				}
			}
			out[f] = rs
		}
		return out
	}
}

// flowOptions are exampleOptions with a flowtest configuration.
func flowOptions(f v1.IPFamily, c flowtest.Config) Options {
	o := exampleOptions(f)
	o.MasqueradeAll = c.MasqueradeAll
	o.LocalDetect = c.LocalDetect(f)
	o.NodePortAddresses = c.NodePortAddresses
	o.LocalhostNodePorts = !c.NoLocalhostNodePorts
	// c.ServiceCIDRs: iptables mode does not use them, as upstream.
	return o
}

func TestPacketFlow(t *testing.T) {
	for _, layout := range []struct {
		name    string
		compact bool
	}{{"upstream", false}, {"compact", true}} {
		t.Run(layout.name, func(t *testing.T) {
			flowtest.Run(t, flowtest.IPTables, flowAdapter(layout.compact))
		})
	}
}
