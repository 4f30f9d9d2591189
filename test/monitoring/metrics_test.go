package monitoring

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// kproxyBin is the kproxy binary built by TestMain; empty when the kernel
// part cannot run here (not root, or no `ip`/`nft`): that test then skips,
// saying why. CI runs as root.
var kproxyBin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if netns.Missing("nft") != "" {
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "kproxy-monitoring-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	// Built in kproxy's own module (../..), with kproxy's go.mod, as users
	// build it; not with this module's dependency versions.
	kproxyBin = filepath.Join(dir, "kproxy")
	cmd := exec.Command("go", "build", "-o", kproxyBin, "./cmd/kproxy")
	cmd.Dir = filepath.Join("..", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building kproxy: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// modeOnly lists the metrics that only one proxy mode exports, as upstream
// registers them only in that mode: they count that mode's kernel objects.
var modeOnly = map[string]string{
	"kubeproxy_sync_proxy_rules_iptables_total":                          "iptables",
	"kubeproxy_sync_proxy_rules_iptables_last":                           "iptables",
	"kubeproxy_sync_proxy_rules_iptables_restore_failures_total":         "iptables",
	"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total": "iptables",
	"kproxy_iptables_other_backend_chains":                               "iptables",
	"kubeproxy_sync_proxy_rules_nftables_sync_failures_total":            "nftables",
	"kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total":         "nftables",
}

// afterEvent lists the metrics that appear only once what they count has
// happened, in upstream kube-proxy as in kproxy: they are vectors whose
// first series is created by the first event (upstream does not create them
// at zero either). The test still requires them to be registered by
// kproxy (so a rename is caught), and fails if one is exported without the
// event, so that this list does not outlive its reason.
var afterEvent = map[string]string{
	"kubeproxy_sync_proxy_rules_iptables_restore_failures_total":         "the first failed iptables-restore",
	"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total": "the first failed partial iptables-restore",
	"kubeproxy_sync_proxy_rules_nftables_sync_failures_total":            "the first failed nftables transaction",
	"kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total":         "the first failed nftables clean-up",
	"kproxy_invalid_objects_total":                                       "the first invalid object (labelled by its kind and the reason)",
	"kproxy_sync_refused_service_ports_total":                            "the first service port the kernel refuses",
}

// proxyMode is how kproxy is started for one mode.
type proxyMode struct {
	name  string
	flag  string   // --proxy-mode
	env   []string // IPTABLES_MODE=…
	needs []string // binaries the mode calls
}

var modes = []proxyMode{
	{name: "nftables", flag: "nftables", needs: []string{"nft"}},
	{name: "iptables-legacy", flag: "iptables", env: []string{"IPTABLES_MODE=legacy"},
		needs: []string{"iptables-legacy-restore", "ip6tables-legacy-restore", "iptables-legacy-save", "ip6tables-legacy-save"}},
	{name: "iptables-nft", flag: "iptables", env: []string{"IPTABLES_MODE=nft"},
		needs: []string{"iptables-nft-restore", "ip6tables-nft-restore", "iptables-nft-save", "ip6tables-nft-save"}},
}

// registered returns the names of every metric kproxy's /metrics registry
// describes (kproxy's, Go runtime's and process metrics), whether or not it
// has a series yet.
func registered() map[string]bool {
	descs := make(chan *prometheus.Desc)
	go func() {
		metrics.Describe(descs)
		close(descs)
	}()
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	out := map[string]bool{}
	for d := range descs {
		if m := fq.FindStringSubmatch(d.String()); m != nil {
			out[m[1]] = true
		}
	}
	// The component metrics (go_*, process_*, rest_client_*, ...) are
	// served from component-base's registry beside kproxy's (see
	// internal/metrics/component.go); those with a sample count.
	if families, err := metrics.Gatherer.Gather(); err == nil {
		for _, f := range families {
			out[f.GetName()] = true
		}
	}
	return out
}

// histogramSuffixes are the series a histogram (or summary) named x is
// exported as.
var histogramSuffixes = []string{"_bucket", "_sum", "_count"}

// baseName is name without a histogram series suffix, when the base is
// known.
func baseName(name string, known map[string]bool) string {
	for _, s := range histogramSuffixes {
		if b, ok := strings.CutSuffix(name, s); ok && known[b] {
			return b
		}
	}
	return name
}

// exported returns the metric names a /metrics text has samples of; a
// histogram's name counts through its _bucket/_sum/_count series.
func exported(body string) map[string]bool {
	out := map[string]bool{}
	histograms := map[string]bool{}
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			if f := strings.Fields(rest); len(f) == 2 && (f[1] == "histogram" || f[1] == "summary") {
				histograms[f[0]] = true
			}
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, _, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		out[name] = true
	}
	for name := range out {
		if b := baseName(name, histograms); b != name {
			out[b] = true
		}
	}
	return out
}

// TestMetricsExported runs kproxy in each mode on the built-in example,
// lets it sync, changes one EndpointSlice (a partial sync and a network
// programming latency observation), asks /healthz and /livez as kubelet and
// load balancers do, and checks that every metric the dashboard and the
// rules name is in its /metrics, except those listed above with a reason.
func TestMetricsExported(t *testing.T) {
	uses := namedMetrics(t)
	if t.Failed() {
		t.FailNow()
	}
	reg := registered()
	for name, where := range uses {
		if !reg[baseName(name, reg)] {
			t.Errorf("metric %s is not registered by kproxy (renamed?); used by:\n  %s", name, strings.Join(where, "\n  "))
		}
	}
	for name := range afterEvent {
		if !reg[name] {
			t.Errorf("afterEvent lists %s, which kproxy does not register", name)
		}
	}
	for name := range modeOnly {
		if !reg[name] {
			t.Errorf("modeOnly lists %s, which kproxy does not register", name)
		}
	}

	netns.Require(t, "nft")
	if kproxyBin == "" {
		t.Skip("kernel test skipped: kproxy was not built")
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			netns.Require(t, m.needs...)
			have := runAndScrape(t, m)
			var missing []string
			for name, where := range uses {
				mode, only := modeOnly[name]
				if only && !strings.HasPrefix(m.name, mode) {
					continue
				}
				_, later := afterEvent[name]
				switch {
				case have[name] && later:
					t.Errorf("%s is exported before %s: remove it from afterEvent", name, afterEvent[name])
				case !have[name] && !later:
					missing = append(missing, fmt.Sprintf("%s (used by %s)", name, strings.Join(where, "; ")))
				}
			}
			sort.Strings(missing)
			for _, s := range missing {
				t.Errorf("not exported by kproxy in %s mode: %s", m.name, s)
			}
		})
	}
}

// syncTimeout bounds each wait for kproxy (its first sync takes well under
// a second; the file source notices a change within about a second).
const syncTimeout = 20 * time.Second

// ipFamilyRE finds a sample's ip_family label value.
var ipFamilyRE = regexp.MustCompile(`^[^#].*[{,]ip_family="([^"]*)"`)

// runAndScrape runs kproxy in mode m in a fresh network namespace and
// returns the metric names of its /metrics.
func runAndScrape(t *testing.T, m proxyMode) map[string]bool {
	dir := t.TempDir()
	snap := filepath.Join(dir, "cluster.yaml")
	if err := os.WriteFile(snap, example.YAML, 0o644); err != nil {
		t.Fatal(err)
	}
	node := netns.New(t, netns.RandomID(4), "node")
	argv := append([]string{"env"}, m.env...)
	argv = append(argv, kproxyBin,
		"--proxy-mode", m.flag,
		"--hostname-override", example.NodeA,
		"--from-file", snap,
		"--cluster-cidr", strings.Join(example.ClusterCIDRs, ","),
		"--metrics-bind-address", "127.0.0.1:10249",
		"--healthz-bind-address", "127.0.0.1:10256",
		"-v", "2")
	p := netns.StartProcess(t, node, "kproxy", dir, argv...)

	scrape := func() (string, string) {
		if done, err := p.Exited(); done {
			t.Fatalf("kproxy exited: %v\n%s", err, p.Tail(netns.LogTailLines))
		}
		code, body, err := node.HTTPGet("http://127.0.0.1:10249/metrics", 2*time.Second)
		if err != nil || code != 200 {
			return "", fmt.Sprintf("metrics: %d %v", code, err)
		}
		return body, ""
	}
	waitFor := func(what string, series ...string) {
		netns.Eventually(t, syncTimeout, what, func() (bool, string) {
			body, why := scrape()
			if why != "" {
				return false, why
			}
			for _, s := range series {
				if !strings.Contains(body, "\n"+s) {
					return false, "no " + s
				}
			}
			return true, ""
		})
	}
	waitFor("kproxy's first sync of both families",
		`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}`,
		`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"}`)

	// One endpoint of web-clusterip moves, changed now (the trigger time
	// network programming latency is measured from); the file is replaced
	// atomically, as the README asks of writers.
	const (
		oldTrigger = `endpoints.kubernetes.io/last-change-trigger-time: "2026-01-15T10:01:00Z"`
		oldAddr    = "- 198.18.130.10\n"
	)
	y := string(example.YAML)
	if strings.Count(y, oldTrigger) != 1 || !strings.Contains(y, oldAddr) {
		t.Fatalf("the example no longer has web-clusterip's slice as this test expects (%q, %q)", oldTrigger, oldAddr)
	}
	// The annotation has whole seconds and kproxy, as upstream, ignores
	// trigger times from before it started: take the next whole second
	// (kproxy started before now) and write once it has passed.
	trigger := time.Now().Truncate(time.Second).Add(time.Second)
	time.Sleep(time.Until(trigger))
	y = strings.Replace(y, oldTrigger,
		`endpoints.kubernetes.io/last-change-trigger-time: "`+trigger.UTC().Format(time.RFC3339)+`"`, 1)
	y = strings.Replace(y, oldAddr, "- 198.18.130.11\n", 1)
	tmp := snap + ".tmp"
	if err := os.WriteFile(tmp, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, snap); err != nil {
		t.Fatal(err)
	}
	waitFor("a partial sync with the change",
		`kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv4"}`,
		`kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"}`)

	for _, path := range []string{"/healthz", "/livez"} {
		if code, body, err := node.HTTPGet("http://127.0.0.1:10256"+path, 2*time.Second); err != nil || code != 200 {
			t.Fatalf("%s: %d %v %s", path, code, err, body)
		}
	}
	body, why := scrape()
	if why != "" {
		t.Fatal(why)
	}
	// The dashboard groups and joins by ip_family: every series that has
	// it must say IPv4 or IPv6.
	for _, line := range strings.Split(body, "\n") {
		if m := ipFamilyRE.FindStringSubmatch(line); m != nil && m[1] != "IPv4" && m[1] != "IPv6" {
			t.Errorf("ip_family %q, want IPv4 or IPv6: %s", m[1], line)
		}
	}
	have := exported(body)
	if len(have) == 0 {
		t.Fatalf("no metric in /metrics:\n%s", body)
	}
	t.Logf("%s mode exports %d metric names", m.name, len(have))
	return have
}
