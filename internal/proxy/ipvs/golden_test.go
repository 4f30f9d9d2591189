package ipvs

import (
	"flag"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
	"github.com/kproxy/kproxy/internal/proxy/localdetect"
	"github.com/kproxy/kproxy/internal/testutil/fixtures"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

const masqueradeBit = 14

// exampleConfig is the configuration of the golden files: cluster CIDRs
// from the example, masquerade bit 14, scheduler rr, node ports on every
// local address (ipvs mode's default).
func exampleConfig(f v1.IPFamily) *Config {
	c := &Config{Family: f, NodeName: example.NodeA, MasqueradeBit: masqueradeBit,
		LocalDetect: localdetect.Config{Mode: localdetect.ClusterCIDR}}
	c.LocalDetect.ClusterCIDRs = fixtures.ClusterCIDRs(f)
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
			fixtures.Golden(t, filepath.Join("testdata", tc.file), got, *update)
			// The restore input must be something iptables-restore takes.
			fixtures.Restorable(t, tc.family, d.IPTables)
			if again := render(); again != got {
				t.Errorf("two renders of the same input differ:\n%s", cmp.Diff(got, again))
			}
		})
	}
}
