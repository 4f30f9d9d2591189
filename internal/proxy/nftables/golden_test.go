package nftables

import (
	"flag"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
	"github.com/kproxy/kproxy/internal/testutil/fixtures"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// TestGoldenExample pins the exact transaction of a full sync of the
// built-in example on node-a. Layout changes show up here as a diff; what
// the rules do is checked by the packet-flow tests.
func TestGoldenExample(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	for _, tc := range []struct {
		family v1.IPFamily
		file   string
		ports  int
	}{
		{model.IPv4, "example-ipv4.nft", 14},
		{model.IPv6, "example-ipv6.nft", 2},
	} {
		t.Run(string(tc.family), func(t *testing.T) {
			if n := len(c.States[tc.family].Services); n != tc.ports {
				t.Fatalf("the example has %d %s service ports, the golden file expects %d", n, tc.family, tc.ports)
			}
			plan := renderFull(t, c, exampleOptions(tc.family))
			if len(plan.Conflicts) > 0 {
				t.Errorf("conflicts: %v", plan.Conflicts)
			}
			got := plan.Tx.String()
			fixtures.Golden(t, filepath.Join("testdata", tc.file), got, *update)
			// The golden text must be something the kernel would load.
			parse(t, got)
			// Rendering is deterministic: a second render is identical.
			if again := renderFull(t, c, exampleOptions(tc.family)).Tx.String(); again != got {
				t.Errorf("two renders of the same input differ:\n%s", cmp.Diff(got, again))
			}
		})
	}
}
