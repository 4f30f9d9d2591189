package e2erun

import (
	"compress/gzip"
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kproxy/kproxy/test/e2e/framework"
)

// listFile is `e2e.test --list-tests` of e2e.test v1.37.2, as
// test/tools/build.sh builds it.
const listFile = "testdata/list-tests-v1.37.2.txt.gz"

func upstreamTests(t *testing.T) []string {
	t.Helper()
	f, err := os.Open(listFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(z)
	if err != nil {
		t.Fatal(err)
	}
	names := ParseTestList(b)
	if len(names) < 3000 {
		t.Fatalf("%s: %d tests, want the whole suite", listFile, len(names))
	}
	return names
}

func selected(t *testing.T, name string, all []string) []string {
	t.Helper()
	m, err := Selections[name].Matcher()
	if err != nil {
		t.Fatal(err)
	}
	return m.Filter(all)
}

func TestParseTestList(t *testing.T) {
	out := []byte("The following spec names can be used with 'ginkgo run --focus/skip':\n" +
		"    k8s.io/kubernetes@v1.37.2/test/e2e/network/service.go:733: [sig-network] Services should serve a basic endpoint from pods [Conformance]\n" +
		"    k8s.io/kubernetes@v1.37.2/test/e2e/network/networking.go:88: [sig-network] Networking should provide Internet connection for containers [Feature:Networking-IPv4]\n\n")
	want := []string{
		"[sig-network] Services should serve a basic endpoint from pods [Conformance]",
		"[sig-network] Networking should provide Internet connection for containers [Feature:Networking-IPv4]",
	}
	if d := cmp.Diff(want, ParseTestList(out)); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}

// TestConformanceServices: the short group is every [Conformance] test of
// [sig-network] Services, and nothing else.
func TestConformanceServices(t *testing.T) {
	all := upstreamTests(t)
	var want []string
	for _, n := range all {
		if strings.HasPrefix(n, "[sig-network] Services ") && strings.Contains(n, "[Conformance]") {
			want = append(want, n)
		}
	}
	got := selected(t, "conformance-services", all)
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("conformance-services (-want +got):\n%s", d)
	}
	if len(got) != 15 {
		t.Errorf("conformance-services selects %d tests, v1.37.2 has 15", len(got))
	}
}

// TestSigNetwork: the full selection holds the proxy's tests and none
// that need a cloud, a second IP family, disruption, or the outside.
func TestSigNetwork(t *testing.T) {
	all := upstreamTests(t)
	got := selected(t, "sig-network", all)
	if len(got) != 93 {
		t.Errorf("sig-network selects %d tests, want 93:\n%s", len(got), strings.Join(got, "\n"))
	}
	for _, n := range selected(t, "conformance-services", all) {
		if !slices.Contains(got, n) {
			t.Errorf("sig-network lacks the conformance test %q", n)
		}
	}
	for _, must := range []string{
		"[sig-network] Networking Granular Checks: Services should function for pod-Service: udp",
		"[sig-network] Networking Granular Checks: Pods should function for intra-pod communication: http [Conformance] [NodeConformance]",
		"[sig-network] Conntrack should be able to preserve UDP traffic when server pod cycles for a NodePort service",
		"[sig-network] KubeProxy should set TCP CLOSE_WAIT timeout [Privileged]",
		"[sig-network] Services should implement service.kubernetes.io/service-proxy-name",
		"[sig-network] Networking Granular Checks: Services should update nodePort: http [Slow]",
	} {
		if !slices.Contains(got, must) {
			t.Errorf("sig-network lacks %q", must)
		}
	}
	never := regexp.MustCompile(`203\.0\.113|serve on different Service CIDRs|external IP is not assigned to a node|\[Disruptive\]|\[Feature:(LoadBalancer|IPv6DualStack|SCTPConnectivity|Networking-IPv4|Networking-IPv6|Networking-Performance)\]|Internet|SCTP|\[sig-network\] (DNS|Netpol|LoadBalancers|Ingress)|\[sig-(?:[^n]|n[^e])`)
	for _, n := range got {
		if never.MatchString(n) {
			t.Errorf("sig-network selects %q", n)
		}
	}
}

// TestNamedSkipsAreLive: every test skipped by name exists and would
// otherwise run in sig-network, so no pattern is dead or mistyped.
func TestNamedSkipsAreLive(t *testing.T) {
	all := upstreamTests(t)
	focus := regexp.MustCompile(strings.Join(Selections["sig-network"].Focus, "|"))
	var candidates []string
	for _, n := range all {
		if focus.MatchString(suiteDescription + " " + n) {
			candidates = append(candidates, n)
		}
	}
	for _, s := range AllNamedSkips() {
		re := regexp.MustCompile(s.Pattern)
		n := 0
		for _, c := range candidates {
			if re.MatchString(suiteDescription + " " + c) {
				n++
			}
		}
		if n == 0 {
			t.Errorf("the skip %q matches no test of sig-network's focus", s.Pattern)
		}
		if s.Reason == "" {
			t.Errorf("the skip %q gives no reason", s.Pattern)
		}
	}
}

// TestSelectionsAgainstE2ETest checks the selections with the built
// e2e.test itself: its test list is the one in testdata, and ginkgo's dry
// run with the selection's flags picks exactly what Matcher picks. Needs
// e2e.test (test/tools/build.sh); a failure where KPROXY_E2E=1.
func TestSelectionsAgainstE2ETest(t *testing.T) {
	dir, err := framework.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	e2e := filepath.Join(dir, "e2e.test")
	if _, err := os.Stat(e2e); err != nil {
		if framework.Mandatory() {
			t.Fatalf("no e2e.test: %v (test/tools/build.sh builds it)", err)
		}
		t.Skipf("no e2e.test in %s (test/tools/build.sh builds it)", dir)
	}
	ctx := context.Background()
	all, err := ListTests(ctx, e2e)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(upstreamTests(t), all); d != "" {
		t.Fatalf("%s --list-tests differs from %s (-testdata +e2e.test):\n%s", e2e, listFile, d)
	}
	for _, name := range SelectionNames() {
		t.Run(name, func(t *testing.T) {
			dry, err := DryRun(ctx, e2e, name)
			if err != nil {
				t.Fatal(err)
			}
			want := selected(t, name, all)
			slices.Sort(want)
			if d := cmp.Diff(want, dry); d != "" {
				t.Errorf("ginkgo's dry run (-Matcher +dry run):\n%s", d)
			}
		})
	}
}
