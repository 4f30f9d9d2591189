package ipvs

import (
	"context"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/kernel/xtables/xtablestest"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
	"github.com/kproxy/kproxy/internal/proxy/localdetect"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

const masqueradeBit = 14

// exampleConfig is the configuration of the golden files: cluster CIDRs
// from the example, masquerade bit 14, scheduler rr, node ports on every
// local address (ipvs mode's default).
func exampleConfig(f v1.IPFamily) *Config {
	c := &Config{Family: f, NodeName: example.NodeA, MasqueradeBit: masqueradeBit,
		LocalDetect: localdetect.Config{Mode: localdetect.ClusterCIDR}}
	for _, s := range example.ClusterCIDRs {
		p := netip.MustParsePrefix(s)
		if model.FamilyOf(p.Addr()) == f {
			c.LocalDetect.ClusterCIDRs = append(c.LocalDetect.ClusterCIDRs, p)
		}
	}
	return c
}

// TestGoldenExample pins what a fresh node-a gets for the built-in
// example in each family: kube-ipvs0's addresses, the virtual and real
// servers, the sets and the iptables-restore input. Layout changes show up
// here as a diff; the feature tests check what each part means.
func TestGoldenExample(t *testing.T) {
	s := flowtest.Example(t, example.NodeA)
	for _, tc := range []struct {
		family v1.IPFamily
		file   string
		ports  int
	}{
		{model.IPv4, "example-ipv4.txt", 14},
		{model.IPv6, "example-ipv6.txt", 2},
	} {
		t.Run(tc.file, func(t *testing.T) {
			state := s.States[tc.family]
			if n := len(state.Services); n != tc.ports {
				t.Fatalf("the example has %d %s service ports, the golden file expects %d", n, tc.family, tc.ports)
			}
			var d *Plan
			render := func() string {
				var err error
				d, err = Render(exampleConfig(tc.family), state, s.Node, Host{Addrs: s.Node.Addresses})
				if err != nil {
					t.Fatal(err)
				}
				return d.Text()
			}
			got := render()
			path := filepath.Join("testdata", tc.file)
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if diff := cmp.Diff(string(want), got); diff != "" {
				t.Errorf("render of the example differs from %s (-want +got; run with -update if intended):\n%s", path, diff)
			}
			// The restore input must be something iptables-restore takes.
			fam := xtables.IPv4
			if tc.family == model.IPv6 {
				fam = xtables.IPv6
			}
			fake := xtablestest.NewFake(xtables.NFT, fam)
			if err := fake.Restore(context.Background(), d.IPTables, xtables.RestoreOptions{NoFlush: true}); err != nil {
				t.Fatalf("the fake refuses the golden input: %v", err)
			}
			if again := render(); again != got {
				t.Errorf("two renders of the same input differ:\n%s", cmp.Diff(got, again))
			}
		})
	}
}
