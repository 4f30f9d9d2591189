package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/proxy/nftables"
)

// kproxyBinary is $KPROXY_BENCH_BIN when set (to measure another build,
// e.g. main's, with the same benchmark), else this tree's, built once.
func kproxyBinary(b *testing.B) string {
	if p := os.Getenv("KPROXY_BENCH_BIN"); p != "" {
		return p
	}
	return buildKproxy(b)
}

var nftCounters = regexp.MustCompile(`counter packets \d+ bytes \d+`)

// tableLines is `nft list table` of one table as a sorted list of lines
// (counters dropped: a repair may list elements in another order).
func tableLines(ns, family, table string) (string, error) {
	out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "table", family, table).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("nft list table %s %s: %v: %s", family, table, err, out)
	}
	return sortedLines(nftCounters.ReplaceAllString(string(out), "counter")), nil
}

// BenchmarkNFTablesDriftRepair runs the kproxy binary in a namespace with
// the file source at 10k services × 10 endpoints (sync period 5 min, so
// that no periodic sync repairs), deletes one of its tables behind its
// back with `nft delete table`, and reports the time from that command's
// return until the table lists again exactly as before (counters
// ignored, lines compared as a set), polled with `nft list table` of
// that table: docs/reliability.md's drift measurement without the
// traffic probe (the benchmark's endpoints are addresses only). Each
// iteration deletes the table again, 2 s after the last repair. After
// the last one the whole ruleset must equal the one before.
func BenchmarkNFTablesDriftRepair(b *testing.B) {
	needRoot(b)
	bin := kproxyBinary(b)
	const n = 10000
	snap := filepath.Join(b.TempDir(), "snapshot.json")
	writeSnapshot(b, snap, n)
	for _, table := range []string{nftables.ShardTable(nftables.DefaultTableName, 3), nftables.DefaultTableName} {
		b.Run("table="+table, func(b *testing.B) {
			ns := newNetns(b)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			logPath := filepath.Join(b.TempDir(), "kproxy.log")
			logf, err := os.Create(logPath)
			if err != nil {
				b.Fatal(err)
			}
			defer logf.Close()
			cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, bin, "--proxy-mode", "nftables",
				"--hostname-override", "node-a", "--from-file", snap, "--cluster-cidr", "198.18.0.0/16",
				"--healthz-bind-address", "", "--metrics-bind-address", "", "--iptables-sync-period", "5m",
				"--conntrack-max-per-core", "0", "-v", "2")
			cmd.Env = append(os.Environ(), "GOMAXPROCS=2")
			cmd.Stdout, cmd.Stderr = logf, logf
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			defer func() {
				_ = cmd.Process.Signal(os.Interrupt)
				_ = cmd.Wait()
			}()
			last := addr([2]byte{198, 19}, n-1).String() + " . tcp . 80"
			lastTable := nftables.ShardTable(nftables.DefaultTableName, nftables.ShardOf(spn(n-1), nftablesShards(n)))
			start := time.Now()
			for {
				out, _ := exec.Command("ip", "netns", "exec", ns, "nft", "get", "element", "ip", lastTable, "cluster-services", "{", last, "}").CombinedOutput()
				if strings.Contains(string(out), "goto") {
					break
				}
				if time.Since(start) > 4*time.Minute {
					b.Fatal("rules never appeared")
				}
				time.Sleep(50 * time.Millisecond)
			}
			time.Sleep(3 * time.Second) // the first sync's clean-up and heap release
			whole, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "ruleset").Output()
			if err != nil {
				b.Fatal(err)
			}
			want, err := tableLines(ns, "ip", table)
			if err != nil {
				b.Fatal(err)
			}
			var took, listed []time.Duration
			b.ResetTimer()
			for range b.N {
				logged, _ := os.ReadFile(logPath)
				if out, err := exec.Command("ip", "netns", "exec", ns, "nft", "delete", "table", "ip", table).CombinedOutput(); err != nil {
					b.Fatalf("nft delete table: %v: %s", err, out)
				}
				broke := time.Now()
				// Repaired: kproxy's log line for the repair's commit (a
				// targeted repair, or the full sync that did it), by its
				// timestamp; polling `nft list table` would add the
				// listing's own time (seconds for a table of 10k
				// elements on a loaded machine).
				var done time.Time
				for done.IsZero() {
					if time.Since(broke) > time.Minute {
						b.Fatalf("%s not repaired within a minute", table)
					}
					time.Sleep(20 * time.Millisecond)
					now, _ := os.ReadFile(logPath)
					done = repairLogged(b, string(now[len(logged):]), broke)
				}
				took = append(took, done.Sub(broke))
				for {
					got, err := tableLines(ns, "ip", table)
					if err == nil && got == want {
						break
					}
					if time.Since(broke) > time.Minute {
						b.Fatalf("%s does not list as before a minute after its repair", table)
					}
					time.Sleep(10 * time.Millisecond)
				}
				listed = append(listed, time.Since(broke))
				b.StopTimer()
				time.Sleep(2 * time.Second)
				b.StartTimer()
			}
			b.StopTimer()
			after, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "ruleset").Output()
			if err != nil {
				b.Fatal(err)
			}
			if a, w := nftCounters.ReplaceAllString(string(after), "counter"), nftCounters.ReplaceAllString(string(whole), "counter"); sortedLines(a) != sortedLines(w) {
				b.Errorf("the ruleset after the repairs differs from the one before")
			}
			slices.Sort(took)
			var sum time.Duration
			for _, d := range took {
				sum += d
			}
			b.ReportMetric(sum.Seconds()/float64(len(took)), "s-to-repaired")
			b.ReportMetric(took[len(took)-1].Seconds(), "s-max")
			slices.Sort(listed)
			b.ReportMetric(listed[len(listed)/2].Seconds(), "s-median-to-listed-equal")
			b.Logf("FIGURE %s | runs %d | repaired in %v | listed as before after %v (sorted)", table, len(took), took, listed)
			logged, _ := os.ReadFile(logPath)
			for _, l := range strings.Split(string(logged), "\n") {
				if strings.Contains(l, "Repaired nftables tables") || strings.Contains(l, "Repairing with a full sync") || strings.Contains(l, "Repair requested") {
					b.Log(l)
				}
			}
		})
	}
}

// repairLogged returns when kproxy's log says a repair was committed
// (zero: not yet): "Repaired nftables tables", or the full sync after
// "Repair requested". klog stamps local time without a year.
func repairLogged(b *testing.B, log string, since time.Time) time.Time {
	for _, l := range strings.Split(log, "\n") {
		if !strings.Contains(l, `"Repaired nftables tables`) && !(strings.Contains(l, `"Synced" ipFamily="IPv4" full=true`) && strings.Contains(log, "Repair requested")) {
			continue
		}
		f := strings.Fields(l)
		if len(f) < 2 || len(f[0]) != 5 {
			b.Fatalf("log line without a klog header: %s", l)
		}
		t, err := time.ParseInLocation("0102 15:04:05.000000", f[0][1:]+" "+f[1], time.Local)
		if err != nil {
			b.Fatalf("log line %q: %v", l, err)
		}
		return t.AddDate(since.Year(), 0, 0)
	}
	return time.Time{}
}

// sortedLines trims the lines of an nft listing (and a trailing comma:
// elements may be listed in another order) and sorts them.
func sortedLines(s string) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(l), ",")); l != "" {
			lines = append(lines, l)
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}
