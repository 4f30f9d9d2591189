package compat

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/test/e2e/framework"
)

// gate is one feature gate upstream registers, as listgates prints it.
type gate struct {
	name     string
	def      bool
	stage    string
	locked   bool
	upstream bool // false: a name only kproxy knows (removed upstream)
}

// kproxyOnlyGates are gate names kproxy knew when this suite was written
// that upstream v1.37 no longer registers (removed after GA), plus one that
// never existed: upstream refuses them, so should kproxy.
var kproxyOnlyGates = []string{
	"TopologyAwareHints", "ServiceTrafficDistribution", "PreferSameTrafficDistribution",
	"WinDSR", "WinOverlay", "ComponentSLIs", "NoSuchGateEver",
}

func upstreamGates(t *testing.T) []gate {
	out, _, err := output(time.Minute, gatesBin)
	if err != nil {
		t.Fatalf("listgates: %v\n%s", err, out)
	}
	var gates []gate
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 4 {
			t.Fatalf("listgates: bad line %q", line)
		}
		gates = append(gates, gate{name: f[0], def: f[1] == "true", stage: f[2], locked: f[3] == "true", upstream: true})
	}
	if len(gates) < 100 {
		t.Fatalf("listgates listed only %d gates", len(gates))
	}
	return gates
}

// gateRun starts bin with a config file naming every gate at once (both
// binaries report every refused gate in one aggregated error) and returns
// what it printed. --write-config-to makes upstream exit after validation;
// a binary still running after the timeout accepted the configuration. It
// runs in a throwaway network namespace against an API server that is not
// there, so nothing it does reaches the host.
func gateRun(t *testing.T, ns, dir, name, bin string, gates map[string]bool) (refusedText string, accepted bool) {
	t.Helper()
	var b strings.Builder
	b.WriteString("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n" +
		"clientConnection:\n  kubeconfig: " + filepath.Join(dir, "nowhere.kubeconfig") + "\n" +
		"mode: nftables\nfeatureGates:\n")
	names := make([]string, 0, len(gates))
	for n := range gates {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(&b, "  %s: %t\n", n, gates[n])
	}
	cfg := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(cfg, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	out, timedOut, err := output(8*time.Second, "ip", "netns", "exec", ns, bin,
		"--config", cfg, "--write-config-to", filepath.Join(dir, name+".written"), "--hostname-override", "compat-gates")
	if timedOut {
		return "", true
	}
	if err == nil {
		return "", true
	}
	return out, false
}

// refusedGates are the gate names out names in a feature gate error
// ("unrecognized feature gate: X", "cannot set feature gate X to ...").
var refusedGate = regexp.MustCompile(`feature gate:? ([A-Za-z0-9]+)|([A-Za-z0-9]+) is enabled, but depends on features that are disabled: \[([^\]]*)\]`)

// acceptance finds which gates of m bin refuses (true) or finds enabled while
// a gate they depend on is disabled (false). Both binaries stop at the
// first unrecognized name, so it runs again without the refused ones until
// the rest is accepted; each run is bounded, and so is their number.
func acceptance(t *testing.T, ns, dir, name, bin string, m map[string]bool) map[string]bool {
	t.Helper()
	left := maps.Clone(m)
	refusedSet := map[string]bool{}
	for i := 0; i <= len(m); i++ {
		out, ok := gateRun(t, ns, dir, name, bin, left)
		if ok {
			return refusedSet
		}
		found := false
		for _, sm := range refusedGate.FindAllStringSubmatch(out, -1) {
			if _, in := left[sm[1]]; in {
				refusedSet[sm[1]] = true
				delete(left, sm[1])
				found = true
			}
			// A dependency error leaves out the gate and what it
			// depends on (the gate may be on by default).
			for _, n := range append([]string{sm[2]}, strings.Fields(sm[3])...) {
				if _, in := left[n]; in && n != "" {
					refusedSet[n] = false
					delete(left, n)
					found = true
				}
			}
		}
		if !found {
			t.Fatalf("%s refused the gate configuration for another reason:\n%s", name, out)
		}
	}
	t.Fatalf("%s: no accepted gate set after %d runs", name, len(m)+1)
	return nil
}

func lookup(m map[string]bool, n string) (bool, bool) {
	v, ok := m[n]
	return v, ok
}

func testGates(t *testing.T) {
	needRoot(t)
	all := upstreamGates(t)
	for _, n := range kproxyOnlyGates {
		all = append(all, gate{name: n, def: false})
	}
	ns := framework.AddNamespace(t, "kpe2e-gates")
	dir := t.TempDir()
	kubeconfig := "apiVersion: v1\nkind: Config\nclusters: [{name: x, cluster: {server: \"https://198.19.255.1:6443\"}}]\n" +
		"users: [{name: x, user: {token: x}}]\ncontexts: [{name: x, context: {cluster: x, user: x}}]\ncurrent-context: x\n"
	if err := os.WriteFile(filepath.Join(dir, "nowhere.kubeconfig"), []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	// Every gate at its default, then every gate at the other value
	// (locked gates must then be refused).
	type result struct{ up, kp string }
	results := map[string]result{} // "Gate=value" -> outcomes
	word := func(refused, in bool) string {
		if in {
			return "refused"
		}
		return "accepted"
	}
	for _, flip := range []bool{false, true} {
		m := map[string]bool{}
		for _, g := range all {
			m[g.name] = g.def != flip
		}
		up := acceptance(t, ns, dir, fmt.Sprintf("kube-proxy-%t", flip), upstreamBin, m)
		// A gate whose dependencies the flipped set disables says nothing
		// about the gate itself: left out for both.
		kpm := maps.Clone(m)
		for n, r := range up {
			if !r {
				delete(kpm, n)
			}
		}
		kp := acceptance(t, ns, dir, fmt.Sprintf("kproxy-%t", flip), kproxyBin, kpm)
		for n, v := range m {
			r := result{word(lookup(up, n)), word(lookup(kp, n))}
			if u, in := up[n]; in && !u {
				r = result{"not compared (depends on a gate set off)", "not compared (depends on a gate set off)"}
			}
			results[fmt.Sprintf("%s=%t", n, v)] = result{r.up, r.kp}
		}
	}
	for _, g := range all {
		t.Run(g.name, func(t *testing.T) {
			var up, kp []string
			for _, v := range []bool{false, true} {
				r := results[fmt.Sprintf("%s=%t", g.name, v)]
				up = append(up, fmt.Sprintf("%t:%s", v, r.up))
				kp = append(kp, fmt.Sprintf("%t:%s", v, r.kp))
			}
			compare(t, kindGate, g.name, g.name, strings.Join(up, ","), strings.Join(kp, ","))
		})
	}
	sectionDone(kindGate)
}
