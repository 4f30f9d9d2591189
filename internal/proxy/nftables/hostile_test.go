package nftables

// Hostile names: whatever namespace, name and port name reach
// the renderer, every comment fits nft's 128 bytes and every name the
// kernel's 255 and nft's unquoted identifiers, the text form is accepted
// by `nft -c -f` and loads nothing but kproxy's tables, the netlink form
// is accepted by the kernel, and the tracer reads both back and shows
// which service a chain is for. Addresses: the example's plan (see
// fixtures_test.go) plus those of internal/testutil/hostile:
// 198.19.50.0/24 and fd00:19::50:0/112 the hostile services' cluster IPs,
// 198.18.129.101+ and fd00:18:1:a::65+ their local endpoints.

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/nft/nfnetlink"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
	"github.com/kproxy/kproxy/internal/proxy/safetext"
	"github.com/kproxy/kproxy/internal/testutil/hostile"
	"github.com/kproxy/kproxy/internal/testutil/netns"
	"github.com/kproxy/kproxy/internal/trace"
	nfttrace "github.com/kproxy/kproxy/internal/trace/nftables"
)

// nftName is what nft reads as an unquoted identifier.
var nftName = regexp.MustCompile(`^[A-Za-z_.][A-Za-z0-9/_.-]*$`)

// hostilePlan renders a fresh node's full sync of the example plus the
// hostile services.
func hostilePlan(t *testing.T, f v1.IPFamily) (*Plan, []hostile.Service) {
	t.Helper()
	c := flowtest.Example(t, "node-a")
	st := c.States[f].Clone()
	svcs := hostile.Add(st, example.NodeA, example.NodeB)
	c.States[f] = st
	plan := renderFull(t, c, exampleOptions(f))
	if len(plan.Conflicts) > 0 {
		t.Fatalf("conflicts: %v", plan.Conflicts)
	}
	return plan, svcs
}

// checkHostileOps checks every comment and name of a transaction.
func checkHostileOps(t *testing.T, tx *nft.Transaction) {
	t.Helper()
	name := func(kind, s string) {
		if len(s) > safetext.NFTName || !nftName.MatchString(s) {
			t.Errorf("%s name %q (%d bytes) is not one nft reads unquoted within %d bytes", kind, s, len(s), safetext.NFTName)
		}
	}
	comment := func(s string) {
		if err := nft.CheckComment(s); err != nil || !safetext.IsComment(s, safetext.NFTComment) {
			t.Errorf("comment %q: %v", s, err)
		}
	}
	for _, op := range tx.Ops {
		switch {
		case op.Table != nil:
			comment(op.Table.Comment)
		case op.Chain != nil:
			name("chain", op.Chain.Name)
			comment(op.Chain.Comment)
		case op.Set != nil:
			name("set", op.Set.Name)
			comment(op.Set.Comment)
		case op.Element != nil:
			name("set", op.Element.Set)
			comment(op.Element.Comment)
			if v := op.Element.Verdict; v != nil && v.Chain != "" {
				name("chain", v.Chain)
			}
		case op.Rule != nil:
			name("chain", op.Rule.Chain)
			comment(op.Rule.Comment)
		}
	}
}

// checkHostileTraced sends a packet from a local pod to every hostile
// service: it must reach that service's endpoints, through a chain whose
// name shows the service.
func checkHostileTraced(t *testing.T, rs *nfttrace.Ruleset, f v1.IPFamily, svcs []hostile.Service) {
	t.Helper()
	src := netip.MustParseAddr("198.18.129.5")
	if f == model.IPv6 {
		src = netip.MustParseAddr("fd00:18:1:a::5")
	}
	for _, s := range svcs {
		res, err := rs.Trace(trace.Packet{Src: src, SrcPort: 40000, Dst: s.Port.ClusterIP, DstPort: 80, Proto: v1.ProtocolTCP, IIF: podIIF}, hostA)
		if err != nil {
			t.Fatalf("%s: trace: %v", s.Case, err)
		}
		var got []string
		for _, e := range res.Endpoints() {
			got = append(got, e.String())
		}
		want := netip.AddrPortFrom(s.Endpoints[0].IP, 8080).String() + "," + netip.AddrPortFrom(s.Endpoints[1].IP, 8080).String()
		if strings.Join(got, ",") != want {
			t.Errorf("%s: a packet to %s ends at %v, want %s\n%s", s.Case, s.Port.ClusterIP, got, want, res)
		}
		if chain := serviceChainName(prefixServiceChain, s.Port.Name); !strings.Contains(res.String(), chain) {
			t.Errorf("%s: the path does not go through %s\n%s", s.Case, chain, res)
		}
	}
}

func TestHostileNamesRender(t *testing.T) {
	var text strings.Builder
	all := map[v1.IPFamily][]hostile.Service{}
	for _, f := range []v1.IPFamily{model.IPv4, model.IPv6} {
		plan, svcs := hostilePlan(t, f)
		checkHostileOps(t, plan.Tx)
		text.WriteString(plan.Tx.String())
		all[f] = svcs
	}
	for i, l := range strings.Split(strings.TrimSuffix(text.String(), "\n"), "\n") {
		w := strings.Fields(l)
		if len(w) < 4 || !strings.Contains(" add flush delete ", " "+w[0]+" ") ||
			!strings.Contains(" table chain set map element rule ", " "+w[1]+" ") ||
			(w[2] != "ip" && w[2] != "ip6") || (w[3] != DefaultTableName && !strings.HasPrefix(w[3], DefaultTableName+shardSuffix)) {
			t.Errorf("line %d: %q is not an operation on kproxy's tables", i+1, l)
		}
		if strings.HasPrefix(l, "add rule ip kube-proxy services accept") {
			t.Errorf("line %d: %q: a name wrote a rule", i+1, l)
		}
	}
	rs := parse(t, text.String())
	for f, svcs := range all {
		checkHostileTraced(t, rs, f, svcs)
	}
	// Names that differ only past the cut or in replaced characters get
	// different chains and comments.
	seen := map[string]string{}
	for _, s := range all[model.IPv4] {
		for _, k := range []string{serviceChainName(prefixServiceChain, s.Port.Name), portComment(s.Port.Name)} {
			if other, ok := seen[k]; ok {
				t.Errorf("%s and %s share %q", other, s.Case, k)
			}
			seen[k] = s.Case
		}
	}
}

// TestHostileNamesKernel gives the same rules to the real kernel in a
// network namespace per family and form: the netlink adapter's
// transaction, and the text through `nft -c -f` then `nft -f`. Only
// kproxy's tables may appear, and the tracer must read `nft list
// ruleset` back (as `kproxy trace --live` does).
func TestHostileNamesKernel(t *testing.T) {
	netns.Require(t, "nft")
	for _, f := range []v1.IPFamily{model.IPv4, model.IPv6} {
		plan, svcs := hostilePlan(t, f)
		check := func(t *testing.T, ns *netns.NS) {
			t.Helper()
			tables, err := ns.Exec(time.Minute, "nft", "list", "tables")
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range strings.Split(strings.TrimSpace(tables), "\n") {
				fields := strings.Fields(l)
				if len(fields) != 3 || fields[0] != "table" {
					t.Fatalf("nft list tables: %q", l)
				}
				if fields[2] != DefaultTableName && !strings.HasPrefix(fields[2], DefaultTableName+shardSuffix) {
					t.Errorf("table %s %s is not kproxy's", fields[1], fields[2])
				}
			}
			out, err := ns.Exec(time.Minute, "nft", "list", "ruleset")
			if err != nil {
				t.Fatal(err)
			}
			rs, err := nfttrace.ParseNFT(out)
			if err != nil {
				t.Fatalf("the tracer cannot read nft list ruleset: %v", err)
			}
			checkHostileTraced(t, rs, f, svcs)
		}
		t.Run(fmt.Sprintf("%s/netlink", f), func(t *testing.T) {
			ns := netns.New(t, netns.RandomID(4), "nft")
			nl, err := nfnetlink.NewNetlink(nfnetlink.WithNetNSPath("/run/netns/" + ns.Name))
			if err != nil {
				t.Fatal(err)
			}
			defer nl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := nl.Apply(ctx, plan.Tx); err != nil {
				t.Fatalf("the kernel refuses the transaction: %v", err)
			}
			check(t, ns)
		})
		t.Run(fmt.Sprintf("%s/text", f), func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "rules.nft")
			if err := os.WriteFile(file, []byte(plan.Tx.String()), 0o600); err != nil {
				t.Fatal(err)
			}
			ns := netns.New(t, netns.RandomID(4), "nft")
			if out, err := ns.Exec(time.Minute, "nft", "-c", "-f", file); err != nil {
				t.Fatalf("nft -c refuses the rules: %v\n%s", err, out)
			}
			if out, err := ns.Exec(time.Minute, "nft", "-f", file); err != nil {
				t.Fatalf("nft -f refuses the rules: %v\n%s", err, out)
			}
			check(t, ns)
		})
	}
}
