package iptables

// Hostile names: whatever namespace, name and port name reach
// the renderer, its restore input is accepted by both iptables-restore
// backends, writes no rule outside kproxy's chains and the jump rules, and
// the tracer still parses it and shows which service a rule is for.
// Addresses: the example's plan (see flow_test.go) plus those of
// internal/testutil/hostile: 198.19.50.0/24 and fd00:19::50:0/112 the
// hostile services' cluster IPs, 198.18.129.101+ their local endpoints.

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
	"github.com/kproxy/kproxy/internal/proxy/safetext"
	"github.com/kproxy/kproxy/internal/testutil/hostile"
	"github.com/kproxy/kproxy/internal/testutil/netns"
	"github.com/kproxy/kproxy/internal/trace"
	iptrace "github.com/kproxy/kproxy/internal/trace/iptables"
)

// hostileRestore renders a fresh node's full sync of the example plus the
// hostile services, as one restore input.
func hostileRestore(t *testing.T, f v1.IPFamily, compact bool) (string, []hostile.Service) {
	t.Helper()
	c := flowtest.Example(t, "node-a")
	st := c.States[f].Clone()
	svcs := hostile.Add(st, example.NodeA, example.NodeB)
	c.States[f] = st
	o := exampleOptions(f)
	o.Hostname = c.Node.Name
	o.CompactLayout = compact
	o.MaxChainsPerRestore = -1
	plan := renderFull(t, c, o)
	if len(plan.Restores) != 1 {
		t.Fatalf("%d restores, want one", len(plan.Restores))
	}
	return string(plan.Restores[0]), svcs
}

// checkOnlyOurs fails for every rule line of restore input or
// iptables-save output that is outside kproxy's chains, other than the
// jump rules, and for every table kproxy does not write.
func checkOnlyOurs(t *testing.T, text string) {
	t.Helper()
	jumps := map[string]bool{}
	for _, lines := range JumpRuleLines() {
		for _, l := range lines {
			jumps[l] = true
		}
	}
	for i, l := range strings.Split(text, "\n") {
		switch {
		case l == "" || l == "COMMIT" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, ":KUBE-"):
		case l == "*filter" || l == "*nat" || l == "*mangle":
		case strings.HasPrefix(l, ":"):
			// iptables-save lists built-in chains with their policy.
			if !strings.Contains(l, " ACCEPT ") && !strings.HasSuffix(l, " ACCEPT") {
				t.Errorf("line %d: %q: a built-in chain's policy changed", i+1, l)
			}
		case strings.HasPrefix(l, "-A KUBE-") || strings.HasPrefix(l, "-X KUBE-") || strings.HasPrefix(l, "-F KUBE-"):
		case strings.HasPrefix(l, "-I "):
			chain, rest, _ := strings.Cut(strings.TrimPrefix(l, "-I "), " 1 ")
			if !jumps["-A "+chain+" "+rest] {
				t.Errorf("line %d: %q inserts a rule that is not a jump rule", i+1, l)
			}
		case strings.HasPrefix(l, "-A "):
			if !jumps[l] {
				t.Errorf("line %d: %q is a rule outside kproxy's chains", i+1, l)
			}
		default:
			t.Errorf("line %d: %q is not a line kproxy writes", i+1, l)
		}
	}
}

// checkTraced loads text into the tracer and sends a packet from a local
// pod to every hostile service: it must reach that service's endpoints,
// and the path must show the service's comment. The example's web service
// must reach its own endpoints only.
func checkTraced(t *testing.T, text string, f v1.IPFamily, svcs []hostile.Service) {
	t.Helper()
	rs := &iptrace.Ruleset{RouteLocalnet: f == model.IPv4}
	if err := rs.Apply([]byte(text), true); err != nil {
		t.Fatalf("the tracer cannot read the rules: %v", err)
	}
	src := netip.MustParseAddr(localPod)
	if f == model.IPv6 {
		src = netip.MustParseAddr(localPod6)
	}
	for _, s := range svcs {
		p := trace.Packet{Src: src, SrcPort: 40000, Dst: s.Port.ClusterIP, DstPort: 80, Proto: v1.ProtocolTCP, IIF: podIIF}
		res, err := rs.Trace(p, hostA)
		if err != nil {
			t.Fatalf("%s: trace: %v", s.Case, err)
		}
		var got []string
		for _, e := range res.Endpoints() {
			got = append(got, e.String())
		}
		want := []string{netip.AddrPortFrom(s.Endpoints[0].IP, 8080).String(), netip.AddrPortFrom(s.Endpoints[1].IP, 8080).String()}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("%s: a packet to %s ends at %v, want %v\n%s", s.Case, s.Port.ClusterIP, got, want, res)
		}
		comment := safetext.Comment(portName(s.Port.Name)+" cluster IP", safetext.IPTablesComment)
		if !strings.Contains(res.String(), comment) {
			t.Errorf("%s: the path does not show the service's comment %q\n%s", s.Case, comment, res)
		}
	}
	if f == model.IPv4 {
		res, err := rs.Trace(trace.Packet{Src: src, SrcPort: 40000, Dst: netip.MustParseAddr("198.19.0.10"), DstPort: 80, Proto: v1.ProtocolTCP, IIF: podIIF}, hostA)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range res.Endpoints() {
			if !strings.Contains(webEps, e.String()) {
				t.Errorf("demo/web-clusterip is sent to %s, not one of its endpoints (%s)", e, webEps)
			}
		}
	}
}

func TestHostileNamesRender(t *testing.T) {
	for _, f := range []v1.IPFamily{model.IPv4, model.IPv6} {
		for _, compact := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/compact=%v", f, compact), func(t *testing.T) {
				text, svcs := hostileRestore(t, f, compact)
				checkOnlyOurs(t, text)
				checkTraced(t, text, f, svcs)
				// Every comment fits xt_comment and holds nothing that
				// would end it.
				for _, l := range strings.Split(text, "\n") {
					_, rest, ok := strings.Cut(l, "--comment ")
					if !ok {
						continue
					}
					arg := rest
					if strings.HasPrefix(rest, `"`) {
						arg, _, _ = strings.Cut(rest[1:], `"`)
					} else {
						arg, _, _ = strings.Cut(rest, " ")
					}
					if !safetext.IsComment(arg, safetext.IPTablesComment) {
						t.Errorf("comment %q is not safe", arg)
					}
				}
			})
		}
	}
}

// TestHostileNamesKernel gives the same input to the real iptables-restore
// of each backend and family, in a network namespace: --test first, then
// for real, and iptables-save must show no rule outside kproxy's chains.
// The tracer must read iptables-save's text back.
func TestHostileNamesKernel(t *testing.T) {
	netns.Require(t)
	for _, b := range xtables.Backends {
		for _, f := range []v1.IPFamily{model.IPv4, model.IPv6} {
			t.Run(fmt.Sprintf("%s/%s", b, f), func(t *testing.T) {
				bin := "iptables"
				if f == model.IPv6 {
					bin = "ip6tables"
				}
				restore, save := bin+"-"+string(b)+"-restore", bin+"-"+string(b)+"-save"
				if m := netns.Missing(restore, save); m != "" {
					t.Skip(m)
				}
				text, svcs := hostileRestore(t, f, false)
				file := filepath.Join(t.TempDir(), "rules")
				if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
					t.Fatal(err)
				}
				ns := netns.New(t, netns.RandomID(4), "ipt")
				if out, err := ns.Exec(restoreTimeout, restore, "--test", "--noflush", file); err != nil {
					t.Fatalf("%s --test refuses the rules: %v\n%s", restore, err, out)
				}
				if out, err := ns.Exec(restoreTimeout, restore, "--noflush", file); err != nil {
					t.Fatalf("%s refuses the rules: %v\n%s", restore, err, out)
				}
				var all strings.Builder
				for _, table := range []string{"filter", "nat", "mangle", "raw", "security"} {
					out, err := ns.Exec(restoreTimeout, save, "-t", table)
					if err != nil {
						t.Fatalf("%s -t %s: %v\n%s", save, table, err, out)
					}
					all.WriteString(out)
				}
				saved := stripSave(all.String())
				checkOnlyOurs(t, saved)
				checkTraced(t, saved, f, svcs)
			})
		}
	}
}

// restoreTimeout bounds each iptables command of the kernel test.
const restoreTimeout = 30 * time.Second

// stripSave drops iptables-save's header lines and counters, and the
// empty tables it lists (raw, security), so that checkOnlyOurs sees rules.
func stripSave(s string) string {
	var out []string
	table := ""
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasPrefix(l, "*") {
			table = l
		}
		if (table == "*raw" || table == "*security") && !strings.HasPrefix(l, "-A ") {
			continue
		}
		if strings.HasPrefix(l, ":") {
			l, _, _ = strings.Cut(l, " [")
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}
