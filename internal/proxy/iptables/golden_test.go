package iptables

import (
	"flag"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
	"github.com/kproxy/kproxy/internal/testutil/fixtures"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// TestGoldenExample pins the exact iptables-restore input of a full sync of
// the built-in example on node-a. Layout changes show up here as a diff;
// what the rules do is checked by the packet-flow tests.
func TestGoldenExample(t *testing.T) {
	c := flowtest.Example(t, "node-a")
	for _, tc := range []struct {
		family  v1.IPFamily
		file    string
		ports   int
		compact bool
	}{
		{model.IPv4, "example-ipv4.rules", 14, false},
		{model.IPv6, "example-ipv6.rules", 2, false},
		{model.IPv4, "example-ipv4-compact.rules", 14, true},
	} {
		t.Run(tc.file, func(t *testing.T) {
			opts := exampleOptions(tc.family)
			opts.CompactLayout = tc.compact
			if n := len(c.States[tc.family].Services); n != tc.ports {
				t.Fatalf("the example has %d %s service ports, the golden file expects %d", n, tc.family, tc.ports)
			}
			plan := renderFull(t, c, opts)
			if len(plan.Restores) != 1 {
				t.Fatalf("the example renders into %d restores, want 1", len(plan.Restores))
			}
			got := plan.Text()
			fixtures.Golden(t, filepath.Join("testdata", tc.file), got, *update)
			// The restore input must be something iptables-restore takes.
			fixtures.Restorable(t, tc.family, []byte(got))
			// Rendering is deterministic.
			if again := renderFull(t, c, opts).Text(); again != got {
				t.Errorf("two renders of the same input differ:\n%s", cmp.Diff(got, again))
			}
		})
	}
}
