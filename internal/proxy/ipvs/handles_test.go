package ipvs

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/kernel/ipset"
	"github.com/kproxy/kproxy/internal/kernel/ipset/ipsettest"
	"github.com/kproxy/kproxy/internal/kernel/ipvs/ipvstest"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
)

// The Plan of the example (both families, a /32 source range added)
// goes into the kernel Handles' fakes as it is, and what they list back is
// what Render wrote: set members in ipset's own text form (the proxier
// compares a Plan with Entries by text, so a member written another way
// would be deleted and added at every sync), virtual servers the kernel
// takes with their real servers.
func TestPlanFitsTheHandles(t *testing.T) {
	s := flowtest.Example(t, example.NodeA)
	sets, vss := ipsettest.New(), ipvstest.New()
	for _, f := range []v1.IPFamily{model.IPv4, model.IPv6} {
		st := s.States[f].Clone()
		for _, sp := range st.Services {
			if len(sp.LoadBalancerSourceRanges) > 0 && f == model.IPv4 {
				c := *sp
				c.LoadBalancerSourceRanges = append(slices.Clone(c.LoadBalancerSourceRanges), netip.MustParsePrefix("192.0.2.7/32"))
				st.Services[sp.Name] = &c
			}
		}
		d, err := Render(exampleConfig(f), st, s.Node, Host{Addrs: s.Node.Addresses})
		if err != nil {
			t.Fatal(err)
		}
		for _, set := range d.SortedSets() {
			if err := ipset.CheckSet(set.Set); err != nil {
				t.Errorf("%v", err)
				continue
			}
			if err := sets.Create(set.Set); err != nil {
				t.Fatalf("create %s: %v", set.Name, err)
			}
			for _, e := range set.Entries {
				if c, err := ipset.Canonical(set.Type, set.IPv6, e); err != nil || c != e {
					t.Errorf("%s: member %q, ipset lists it as %q (%v)", set.Name, e, c, err)
				}
				if err := sets.Add(set.Name, e); err != nil {
					t.Errorf("%s: add %q: %v", set.Name, e, err)
				}
			}
			got, err := sets.Entries(set.Name)
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(got)
			if diff := cmp.Diff(set.Entries, got, cmpEmpty); diff != "" {
				t.Errorf("%s lists (-rendered +listed):\n%s", set.Name, diff)
			}
		}
		for _, vs := range d.Sorted() {
			if err := vss.AddService(vs.Service); err != nil {
				t.Fatalf("add %v: %v", vs.VirtualServer, err)
			}
			for _, r := range vs.Reals {
				if err := vss.AddDestination(vs.VirtualServer, r); err != nil {
					t.Errorf("%v: add %v: %v", vs.VirtualServer, r, err)
				}
			}
		}
	}
	list, err := vss.Services()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 20+3 {
		t.Errorf("the fake holds %d virtual servers, want the example's 20 IPv4 and 3 IPv6", len(list))
	}
}

var cmpEmpty = cmp.Comparer(func(a, b []string) bool { return len(a) == 0 && len(b) == 0 || slices.Equal(a, b) })
