package ipvs

// FuzzRender: a snapshot made from fuzz bytes (internal/testutil/fuzzsnap:
// up to six services of every type through the model, plus one port with a
// fuzzed name put in directly) is rendered for a fresh node-a in each
// family. Render must not fail; every set and member must be one the kernel
// takes, written as ipset lists it (ipsettest); every virtual server and
// real server one IPVS takes (ipvstest); the iptables input one
// iptables-restore takes (xtablestest); and each cluster IP's real servers
// must be the endpoints the model allows for internal traffic, but for
// upstream's one difference: internal policy Local without local
// endpoints uses the cluster's endpoints. Addresses: see
// internal/testutil/fuzzsnap.

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	"github.com/kproxy/kproxy/internal/kernel/ipset"
	"github.com/kproxy/kproxy/internal/kernel/ipset/ipsettest"
	"github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/kernel/ipvs/ipvstest"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/kernel/xtables/xtablestest"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/testutil/fuzzsnap"
	"github.com/kproxy/kproxy/internal/testutil/hostile"
)

func FuzzRender(f *testing.F) {
	fuzzsnap.Quiet()
	names := []string{"http", "a", hostile.Injection, hostile.Commit, hostile.Long.Name, "café\"\n"}
	for i, s := range fuzzsnap.RenderSeeds() {
		f.Add(s, names[i%len(names)], i%3)
	}
	f.Fuzz(func(t *testing.T, data []byte, name string, sched int) {
		snap := fuzzsnap.Build(data, name)
		sets, vss := ipsettest.New(), ipvstest.New()
		for _, fam := range fuzzsnap.Families {
			c := exampleConfig(fam)
			c.NodeName = fuzzsnap.Node
			c.Scheduler = []string{"", "mh", "wlc"}[((sched%3)+3)%3]
			st := snap.States[fam]
			d, err := Render(c, st, snap.Node, Host{Addrs: snap.Node.Addresses})
			if err != nil {
				t.Fatalf("%s: %v", fam, err)
			}
			for _, s := range d.SortedSets() {
				if err := sets.Create(s.Set); err != nil {
					t.Fatalf("create %s: %v", s.Name, err)
				}
				for _, e := range s.Entries {
					if c, err := ipset.Canonical(s.Type, s.IPv6, e); err != nil || c != e {
						t.Errorf("%s: member %q is listed as %q (%v)", s.Name, e, c, err)
					}
					if err := sets.Add(s.Name, e); err != nil {
						t.Errorf("%s: add %q: %v", s.Name, e, err)
					}
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
			xfam := xtables.IPv4
			if fam == model.IPv6 {
				xfam = xtables.IPv6
			}
			if err := xtablestest.NewFake(xtables.NFT, xfam).Restore(context.Background(), d.IPTables, xtables.RestoreOptions{NoFlush: true}); err != nil {
				t.Fatalf("%s: the xtables fake refuses the input: %v\n%s", fam, err, d.IPTables)
			}
			for _, n := range st.SortedNames() {
				sp := st.Services[n]
				vs := d.Services[ipvs.VirtualServer{Protocol: protoNumber(sp.Protocol), Addr: sp.ClusterIP, Port: uint16(sp.Port), Family: addrFamily(fam)}]
				if vs == nil {
					t.Errorf("%s: no virtual server for the cluster IP", n)
					continue
				}
				if vs.Name != n {
					continue // two ports on one address: the model resolved it for another
				}
				want := fuzzsnap.Allowed(st, sp)
				if sp.InternalPolicyLocal && len(want) == 0 {
					for _, e := range model.SelectEndpoints(sp, st.Endpoints[n], fuzzsnap.Node, fuzzsnap.Zone).Cluster {
						want = append(want, e.AddrPort())
					}
				}
				slices.SortFunc(want, netip.AddrPort.Compare)
				want = slices.Compact(want)
				var got []netip.AddrPort
				for _, r := range vs.Reals {
					got = append(got, netip.AddrPortFrom(r.Addr, r.Port))
				}
				if !slices.Equal(got, want) {
					t.Errorf("%s: real servers %v, want %v", n, got, want)
				}
			}
		}
	})
}
