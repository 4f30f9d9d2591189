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
	{`\[sig-network\] Networking should provide Internet connection for containers \[Feature:Networking-IPv4\]`,
		"connects to 8.8.8.8:53: internet connectivity"},
	{`\[sig-network\] Networking should provide Internet connection for containers \[Feature:Networking-IPv6\]`,
		"connects to 2001:4860:4860::8888:53: internet connectivity"},
	{`\[sig-network\] Networking should provider Internet connection for containers using DNS`,
		"resolves and connects to google.com: an external DNS name and internet connectivity"},
	{`\[sig-network\] Service CIDRs should create Services and serve on different Service CIDRs`,
		"serves a Service from a new ServiceCIDR, 203.0.113.0/24 (TEST-NET-3): an address outside the sandbox's ranges, to which pods have no route"},
	{`\[sig-network\] Services should be possible to connect to a service via ExternalIP when the external IP is not assigned to a node`,
		"connects to external IP 203.0.113.250 (TEST-NET-3): an address outside the sandbox's ranges, to which pods have no route"},
}

// EnvironmentSkips are tests that cannot pass in this environment with any
// proxy, skipped by name.
var EnvironmentSkips = []NamedSkip{
	{`\[sig-network\] Services should allow creating a basic SCTP service with pod and endpoints`,
		"SCTP: the host kernel has no sctp module"},
	{`\[sig-network\] Networking should allow creating a Pod with an SCTP HostPort`,
		"SCTP: the host kernel has no sctp module"},
	{`\[sig-network\] LocalhostNodePorts should let a node pull an image from a registry exposed via localhost NodePort`,
		"serves agnhost's fake registry, whose images upstream's agnhost build downloads from the internet; the agnhost built here (test/tools/images.sh) has none"},
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
	// features the cluster does not have: cloud load balancers, a second
	// IP family, SCTP (the host kernel has no sctp module), and the
	// performance suites (iperf2, DNS at scale), which are measurements
	// rather than checks.
	absentFeatures = `\[Feature:(LoadBalancer|IPv6DualStack|SCTPConnectivity|Networking-Performance|PerformanceDNS)\]`
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
			`\[sig-network\] (Services|KubeProxy|Conntrack|Networking|Service CIDRs|LocalhostNodePorts|Traffic Distribution|Topology Hints|Connectivity Pod Lifecycle|NoSNAT|HostPort) `,
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
	for _, n := range AllNamedSkips() {
		out = append(out, n.Pattern)
	}
	return out
}

// AllNamedSkips are NamedSkips and EnvironmentSkips.
func AllNamedSkips() []NamedSkip {
	return slices.Concat(NamedSkips, EnvironmentSkips)
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
