package e2erun

import (
	"regexp"
	"slices"
	"strings"
)

// Selection is a set of upstream's e2e tests, chosen as ginkgo chooses:
// a test runs when its full text matches one of Focus and none of Skip or
// of NamedSkips.
type Selection struct {
	Name, Doc string
	Focus     []string
	Skip      []string
}

// NamedSkip is a test that is never run, named by a regular expression on
// its full text, and why.
type NamedSkip struct {
	Pattern, Reason string
}

// NamedSkips are the tests that reach outside the cluster's sandbox: no
// node or pod has a route out of the namespaces the cluster harness made,
// and traffic must never leave them. Every selection skips them.
var NamedSkips = []NamedSkip{
	{`\[sig-network\] Networking should provide Internet connection for containers`, "connects to 8.8.8.8 (IPv4) or 2001:4860:4860::8888 (IPv6): internet connectivity"},
	{`\[sig-network\] Networking should provider Internet connection for containers using DNS`, "resolves and connects to google.com: external DNS names and internet connectivity"},
}

// Tags of tests no selection runs, and why.
var (
	// disruptive tests restart or break components (kube-proxy, the
	// apiserver, nodes) by SSH or the provider: the skeleton provider has
	// neither, and a disrupted shared cluster would fail later tests.
	disruptive = `\[Disruptive\]`
	// flaky tests are known to fail at random upstream.
	flaky = `\[Flaky\]`
	// Alpha feature gates are off in the cluster.
	alpha = `\[Alpha\]|\[Feature:OffByDefault\]`
	// features the cluster does not have: a second IP family, SCTP
	// (the host has no sctp module), and the performance suites (iperf
	// at scale, DNS at scale) that are measurements, not checks.
	absentFeatures = `\[Feature:(IPv6DualStack|SCTPConnectivity|NetworkingPerformance|PerformanceDNS)\]`
)

// Selections are the runs hack/conformance.sh knows.
var Selections = map[string]Selection{
	"conformance-services": {
		Name: "conformance-services",
		Doc:  "the [Conformance] tests of [sig-network] Services: the short in-cluster group of the suite",
		Focus: []string{
			`\[sig-network\] Services .*\[Conformance\]`,
		},
		Skip: []string{disruptive, flaky},
	},
	"sig-network": {
		Name: "sig-network",
		Doc: "the [sig-network] tests of Services, the service proxy, Conntrack and Networking that fit a cluster " +
			"without a cloud provider: the [Conformance] ones and the non-disruptive rest, [Serial] and [Slow] included",
		Focus: []string{
			`\[sig-network\] (Services|KubeProxy|Conntrack|Networking|Service CIDRs|LocalhostNodePorts|Traffic Distribution|Topology Hints|Connectivity Pod Lifecycle|NoSNAT|HostPort|EndpointSlice|Endpoints|Service endpoints latency) `,
		},
		Skip: []string{disruptive, flaky, alpha, absentFeatures},
	},
}

// SelectionNames are the selections' names, sorted.
func SelectionNames() []string {
	var names []string
	for n := range Selections {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// skips are the selection's skip patterns and every named skip.
func (s Selection) skips() []string {
	out := slices.Clone(s.Skip)
	for _, n := range NamedSkips {
		out = append(out, n.Pattern)
	}
	return out
}

// suiteDescription is what ginkgo puts before a test's text when it
// matches --ginkgo.focus and --ginkgo.skip.
const suiteDescription = "Kubernetes e2e suite"

// Matcher chooses tests by their full text (e2e.test --list-tests prints
// them) the way ginkgo does for the selection's flags.
type Matcher struct {
	focus, skip *regexp.Regexp
}

// Matcher compiles the selection's patterns; ginkgo ORs every --focus and
// every --skip.
func (s Selection) Matcher() (Matcher, error) {
	focus, err := regexp.Compile(strings.Join(s.Focus, "|"))
	if err != nil {
		return Matcher{}, err
	}
	skip, err := regexp.Compile(strings.Join(s.skips(), "|"))
	if err != nil {
		return Matcher{}, err
	}
	return Matcher{focus, skip}, nil
}

// Match reports whether the test of full text name runs.
func (m Matcher) Match(name string) bool {
	text := suiteDescription + " " + name
	return m.focus.MatchString(text) && !m.skip.MatchString(text)
}

// Filter returns the names that run, in order.
func (m Matcher) Filter(names []string) []string {
	var out []string
	for _, n := range names {
		if m.Match(n) {
			out = append(out, n)
		}
	}
	return out
}
