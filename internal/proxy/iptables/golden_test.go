package iptables

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/kernel/xtables/xtablestest"
	"github.com/kproxy/kproxy/internal/model"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// TestGoldenExample pins the exact iptables-restore input of a full sync of
// the built-in example on node-a. Layout changes show up here as a diff;
// what the rules do is checked by the packet-flow tests.
func TestGoldenExample(t *testing.T) {
	c := loadExample(t, "node-a")
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
			if n := len(c.states[tc.family].Services); n != tc.ports {
				t.Fatalf("the example has %d %s service ports, the golden file expects %d", n, tc.family, tc.ports)
			}
			plan := c.renderFull(t, opts)
			if len(plan.Restores) != 1 {
				t.Fatalf("the example renders into %d restores, want 1", len(plan.Restores))
			}
			got := plan.Text()
			path := filepath.Join("testdata", tc.file)
			if *update {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
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
				t.Errorf("full sync of the example differs from %s (-want +got; run with -update if intended):\n%s", path, diff)
			}
			// The restore input must be something iptables-restore takes.
			fam := xtables.IPv4
			if tc.family == model.IPv6 {
				fam = xtables.IPv6
			}
			fake := xtablestest.NewFake(xtables.NFT, fam)
			if err := fake.Restore(context.Background(), []byte(got), xtables.RestoreOptions{NoFlush: true}); err != nil {
				t.Fatalf("the fake refuses the golden input: %v", err)
			}
			// Rendering is deterministic.
			if again := c.renderFull(t, opts).Text(); again != got {
				t.Errorf("two renders of the same input differ:\n%s", cmp.Diff(got, again))
			}
		})
	}
}
