package iptables

// FuzzRender: a snapshot made from fuzz bytes (internal/testutil/fuzzsnap:
// up to six services of every type through the model, plus one port with a
// fuzzed name put in directly) is rendered as a fresh node's full sync of
// each family, in the normal or the compact layout. The restore input must
// be accepted by `iptables-restore --test` and `ip6tables-restore --test`
// of both backends (legacy and nft; in a throwaway network namespace made
// once per process and deleted at the end; as non-root that part is
// skipped, logged once), hold no rule outside kproxy's chains, load into
// the tracer, and a packet from a local pod to every service port's
// cluster IP must end at one of the endpoints the model chose, or be
// dropped or rejected when it chose none. Addresses: see
// internal/testutil/fuzzsnap. Seeds: f.Add below plus
// testdata/fuzz/FuzzRender.

import (
	"os"
	"path/filepath"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/testutil/fuzzsnap"
	"github.com/kproxy/kproxy/internal/testutil/hostile"
	"github.com/kproxy/kproxy/internal/testutil/netns"
	"github.com/kproxy/kproxy/internal/trace"
	iptrace "github.com/kproxy/kproxy/internal/trace/iptables"
)

func FuzzRender(f *testing.F) {
	fuzzsnap.Quiet()
	names := []string{"http", "a", hostile.Injection, hostile.Commit, hostile.Long.Name, "café\"\n"}
	for i, s := range fuzzsnap.RenderSeeds() {
		f.Add(s, names[i%len(names)], i%2 == 1)
	}
	// The restore binaries to check with, per family.
	restores := map[v1.IPFamily][]string{}
	var ns *netns.NS
	file := filepath.Join(f.TempDir(), "rules")
	if why := netns.Missing(); why != "" {
		f.Logf("iptables-restore --test check skipped: %s", why)
	} else {
		for _, b := range xtables.Backends {
			for fam, bin := range map[v1.IPFamily]string{model.IPv4: "iptables", model.IPv6: "ip6tables"} {
				r := bin + "-" + string(b) + "-restore"
				if why := netns.Missing(r); why != "" {
					f.Logf("%s --test check skipped: %s", r, why)
					continue
				}
				restores[fam] = append(restores[fam], r)
			}
		}
		ns = netns.New(f, netns.RandomID(4), "fuzz-ipt")
	}
	f.Fuzz(func(t *testing.T, data []byte, name string, compact bool) {
		snap := fuzzsnap.Build(data, name)
		rulesets := map[v1.IPFamily]*iptrace.Ruleset{}
		for _, fam := range fuzzsnap.Families {
			o := exampleOptions(fam)
			o.Hostname = fuzzsnap.Node
			o.CompactLayout = compact
			o.MaxChainsPerRestore = -1
			plan := Render(o.RenderConfig(snap.Node, snap.Node.Addresses), &Input{
				RenderInput: proxy.RenderInput{State: snap.States[fam], NodeName: fuzzsnap.Node, Zone: fuzzsnap.Zone, Changed: sets.New[model.ServicePortName]()},
				Full:        true,
				Existing:    &Existing{},
			}, NewApplied())
			if len(plan.Restores) != 1 {
				t.Fatalf("%s: %d restores, want one", fam, len(plan.Restores))
			}
			text := plan.Restores[0]
			checkOnlyOurs(t, string(text))
			rs := &iptrace.Ruleset{RouteLocalnet: fam == model.IPv4}
			if err := rs.Apply(text, true); err != nil {
				t.Fatalf("%s: the tracer refuses the rules: %v\n%s", fam, err, text)
			}
			rulesets[fam] = rs
			if ns == nil {
				continue
			}
			if err := os.WriteFile(file, text, 0o600); err != nil {
				t.Fatal(err)
			}
			for _, r := range restores[fam] {
				if out, err := ns.Exec(restoreTimeout, r, "--test", "--noflush", file); err != nil {
					t.Fatalf("%s --test refuses the rules: %v\n%s\n%s", r, err, out, text)
				}
			}
		}
		fuzzsnap.CheckTraced(t, snap, podIIF, func(fam v1.IPFamily, p trace.Packet) (*trace.Result, error) {
			return rulesets[fam].Trace(p, hostA)
		})
	})
}
