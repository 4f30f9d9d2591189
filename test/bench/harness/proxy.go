package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kproxy/kproxy/test/e2e/framework"
)

// The modes a run can measure.
var knownModes = []string{"nftables", "iptables-legacy", "iptables-nft", "ipvs-legacy", "ipvs-nft"}

// Proxy is a binary under test: "kproxy", or "upstream" (or another
// kube-proxy-compatible binary: it must take kube-proxy's flags).
type Proxy struct {
	Name string
	Bin  string
}

// clusterCIDRs covers the generated pods of both families.
const clusterCIDRs = "198.18.0.0/16,fd00:18::/32"

// argv is the command line of p in mode on node, with the extra flags
// (the source: --kubeconfig or --from-file) appended. iptables modes pick
// the backend both ways, as the binary may be either: kproxy reads
// IPTABLES_MODE; upstream's binary calls `iptables` from PATH, so PATH
// starts with a directory where iptables* are that backend's binaries.
func (p Proxy) argv(tb *TB, mode, node string, verbosity int, extra ...string) ([]string, error) {
	proxyMode, backend, _ := strings.Cut(mode, "-")
	flags := []string{
		"--hostname-override", node, "--proxy-mode", proxyMode, "--cluster-cidr", clusterCIDRs,
		// nf_conntrack_max is global and read-only in a namespace.
		"--conntrack-max-per-core", "0",
		"--metrics-bind-address", metricsListen, "--healthz-bind-address", healthzListen,
		fmt.Sprintf("--v=%d", verbosity),
	}
	flags = append(flags, extra...)
	env := []string{"GOMAXPROCS=2"}
	if backend != "" {
		// Both, whatever the binary is: a kproxy under another name
		// (NAME=PATH) would otherwise pick its backend by itself.
		dir, err := iptablesShim(tb, backend)
		if err != nil {
			return nil, err
		}
		env = append(env, "IPTABLES_MODE="+backend, "PATH="+dir+":"+os.Getenv("PATH"))
	}
	// `env` execs the binary in place: the process is the proxy itself.
	return append(append([]string{"env"}, env...), append([]string{p.Bin}, flags...)...), nil
}

// iptablesShim is a directory whose iptables, iptables-save, ... are the
// backend's (iptables-legacy, ...).
func iptablesShim(tb *TB, backend string) (string, error) {
	dir := filepath.Join(tb.TempDir(), "iptables-"+backend)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for _, fam := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			target := "/usr/sbin/" + fam + "-" + backend + suffix
			if _, err := os.Stat(target); err != nil {
				return "", fmt.Errorf("backend %s: %w", backend, err)
			}
			if err := os.Symlink(target, filepath.Join(dir, fam+suffix)); err != nil {
				return "", err
			}
		}
	}
	return dir, nil
}

// firstSync is what a proxy's first sync cost, read from its /metrics
// and /proc once every IP family it syncs has synced once.
type firstSync struct {
	// TimeTo is from the process's start until its last family's first
	// sync ended (kubeproxy_sync_proxy_rules_last_timestamp_seconds).
	TimeTo float64
	// Seconds is the longest family's first sync (its duration histogram).
	Seconds float64
	// CPU is the process's CPU seconds when the first sync was seen.
	CPU float64
}

// hostFamilies is how many IP families a proxy syncs here: kproxy (in one
// loop) and upstream (dual-stack mode) sync IPv6 too when the kernel has
// it, with no IPv6 service an empty sync.
func hostFamilies() int {
	if _, err := os.Stat("/proc/net/if_inet6"); err == nil {
		return 2
	}
	return 1
}

// waitFirstSync polls the proxy's /metrics until every family's sync
// histogram has a sample and no new family has appeared for a while (see
// window), or, when families is not 0, until that many families synced
// (however long apart); within limit.
func waitFirstSync(tb *TB, ns string, p *framework.Process, started time.Time, limit time.Duration, families int) firstSync {
	client := framework.HTTPClientIn(ns)
	deadline := time.Now().Add(limit)
	seen := map[string]firstSync{}
	var lastNew time.Time
	var cpuAtLast float64
	for time.Now().Before(deadline) {
		tb.Check()
		select {
		case <-p.Done():
			tb.Fatalf("%s exited before its first sync: %v\n%s", p.Name, p.ExitError(), p.Tail(30))
		default:
		}
		ctx, cancel := context.WithTimeout(tb.Context(), 5*time.Second)
		m, err := scrape(ctx, client, metricsURL)
		cancel()
		if err == nil {
			counts := m.Series(mSync + "_count")
			sums := m.Series(mSync + "_sum")
			last := m.Series(mSyncLast)
			for labels, c := range counts {
				if _, ok := seen[labels]; ok || c < 1 {
					continue
				}
				ts := 0.0
				for l, v := range last { // the gauge's labels are the family's
					if labels == "" || strings.Contains(labels, l) || l == "" {
						ts = max(ts, v)
					}
				}
				seen[labels] = firstSync{TimeTo: ts - float64(started.UnixNano())/1e9, Seconds: sums[labels] / c}
				lastNew, cpuAtLast = time.Now(), cpuSeconds(p.Pid())
			}
			// Families may sync one after the other (kproxy: in one loop,
			// in any order), so a family that finished first says little
			// about how long the next takes: wait as long again as the
			// first took from the start, at least 3 s.
			// With families known, only all of them end the wait.
			window := max(wait(3*time.Second), lastNew.Sub(started))
			quiet := families <= 0 && time.Since(lastNew) > window
			if len(seen) > 0 && (quiet || families > 0 && len(seen) >= families) {
				var out firstSync
				for _, f := range seen {
					out.TimeTo = max(out.TimeTo, f.TimeTo)
					out.Seconds = max(out.Seconds, f.Seconds)
				}
				out.CPU = cpuAtLast
				return out
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	tb.Fatalf("%s: no first sync within %s\n%s", p.Name, limit, p.Tail(30))
	return firstSync{}
}
