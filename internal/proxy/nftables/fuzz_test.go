package nftables

// FuzzRender: a snapshot made from fuzz bytes (internal/testutil/fuzzsnap:
// up to six services of every type through the model, plus one port with a
// fuzzed name put in directly) is rendered as a fresh node's full sync of
// both families. The text must be accepted by `nft -c -f` (in a throwaway
// network namespace made once per process and deleted at the end; as
// non-root that part is skipped, logged once), every name and comment must
// be one nft reads, the tracer must load it, and a packet from a local pod
// to every service port's cluster IP must end at one of the endpoints the
// model chose, or be dropped or rejected when it chose none. Addresses:
// see internal/testutil/fuzzsnap. Seeds: f.Add below plus
// testdata/fuzz/FuzzRender.

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/localdetect"
	"github.com/kproxy/kproxy/internal/testutil/fuzzsnap"
	"github.com/kproxy/kproxy/internal/testutil/hostile"
	"github.com/kproxy/kproxy/internal/testutil/netns"
	"github.com/kproxy/kproxy/internal/trace"
	nfttrace "github.com/kproxy/kproxy/internal/trace/nftables"
)

func FuzzRender(f *testing.F) {
	fuzzsnap.Quiet()
	for i, s := range fuzzsnap.RenderSeeds() {
		f.Add(s, []string{"http", "a", hostile.NFTInjection, hostile.Injection, hostile.Long.Name, "café\"\n"}[i%6])
	}
	var ns *netns.NS
	file := filepath.Join(f.TempDir(), "rules.nft")
	if why := netns.Missing("nft"); why != "" {
		f.Logf("nft -c check skipped: %s", why)
	} else {
		ns = netns.New(f, netns.RandomID(4), "fuzz-nft")
	}
	f.Fuzz(func(t *testing.T, data []byte, name string) {
		snap := fuzzsnap.Build(data, name)
		var text strings.Builder
		for _, fam := range fuzzsnap.Families {
			o := Options{Family: fam, ModeOptions: config.ModeOptions{MasqueradeBit: masqueradeBit, LocalDetect: localdetect.Config{Mode: localdetect.ClusterCIDR}}, ServicesPerShard: 4}
			o.LocalDetect.ClusterCIDRs = exampleOptions(fam).LocalDetect.ClusterCIDRs
			cfg := o.RenderConfig(snap.Node, snap.Node.Addresses)
			plan := Render(cfg, &Input{
				RenderInput: proxy.RenderInput{State: snap.States[fam], NodeName: fuzzsnap.Node, Zone: fuzzsnap.Zone, Changed: sets.New[model.ServicePortName]()},
				Full:        true,
			}, NewApplied())
			if len(plan.Conflicts) > 0 {
				t.Errorf("%s: conflicts left after the model resolved claims: %v", fam, plan.Conflicts)
			}
			checkHostileOps(t, plan.Tx)
			text.WriteString(plan.Tx.String())
		}
		rs, err := nfttrace.ParseNFT(text.String())
		if err != nil {
			t.Fatalf("the tracer refuses the rules: %v\n%s", err, text.String())
		}
		fuzzsnap.CheckTraced(t, snap, podIIF, func(_ v1.IPFamily, p trace.Packet) (*trace.Result, error) {
			return rs.Trace(p, hostA)
		})
		if ns == nil {
			return
		}
		if err := os.WriteFile(file, []byte(text.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := ns.Exec(time.Minute, "nft", "-c", "-f", file); err != nil {
			t.Fatalf("nft -c refuses the rules: %v\n%s\n%s", err, out, text.String())
		}
	})
}
