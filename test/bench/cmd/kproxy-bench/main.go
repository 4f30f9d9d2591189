// kproxy-bench measures kproxy, and any kube-proxy-compatible binary
// (upstream kube-proxy by default), on generated clusters: with the file
// source in a fresh network namespace (kproxy alone, sync phases and
// memory), and side by side against a real kube-apiserver (first sync,
// CPU, memory, per-change sync time and network programming latency, the
// data plane). It writes report.json, report.md and SVG plots. Run as
// root; see docs/benchmarks.md.
//
//	go run ./test/bench/cmd/kproxy-bench --services 1000,10000 --modes nftables,iptables-legacy --out /tmp/bench
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kproxy/kproxy/test/bench/cluster"
	"github.com/kproxy/kproxy/test/bench/harness"
	"github.com/kproxy/kproxy/test/e2e/framework"
)

func main() { os.Exit(run()) }

func run() int {
	fs := flag.NewFlagSet("kproxy-bench", flag.ContinueOnError)
	services := fs.String("services", "1000,10000", "service counts, comma-separated (up to 55000)")
	mix := fs.String("mix", string(cluster.Realistic), "cluster shape: realistic or plain")
	seed := fs.Uint64("seed", 1, "generator seed: same seed, same cluster")
	modes := fs.String("modes", "nftables,iptables-legacy", "modes, comma-separated: nftables, iptables-legacy, iptables-nft")
	proxies := fs.String("proxies", "kproxy,upstream", "proxies, comma-separated: kproxy, upstream, or NAME=PATH of another kube-proxy-compatible binary")
	kproxyBin := fs.String("kproxy", "", "kproxy binary (default: built from this checkout)")
	upstreamBin := fs.String("upstream", "", "upstream kube-proxy binary (default: $KPROXY_E2E_BIN/kube-proxy, built by test/tools/build.sh)")
	reps := fs.Int("reps", 5, "repetitions of every figure")
	changes := fs.Int("changes", 5, "endpoint changes per API server run")
	changeGap := fs.Duration("change-gap", 0, "rest between API server changes, from one change programmed to the next made (0: 3 s, a proxy at rest)")
	fileChanges := fs.Int("file-changes", 0, "how many of each single change a file-source run makes (0: 5 endpoint flips, 3 of each other kind)")
	what := fs.String("measure", "file,apiserver,dataplane", "what to measure: file (kproxy, file source), apiserver (side by side), dataplane (connects, in the API server runs)")
	soak := fs.Int("soak", 0, "after the API server runs, make this many endpoint changes at a steady rate with each soak proxy, sampling its memory (0: no soak)")
	soakFor := fs.Duration("soak-for", 10*time.Minute, "how long the soak's changes are spread over")
	soakProxies := fs.String("soak-proxies", "", "proxies that soak, comma-separated (default: all)")
	soakProfile := fs.Bool("soak-profile", false, "run soaking proxies with --profiling and write into --out a CPU profile of up to 30 s from the middle of each soak and heap profiles of its settled and end moments")
	merge := fs.String("merge", "", "measure nothing: join these report.json files, comma-separated, into one report in --out (no root needed)")
	keepLogs := fs.Bool("keep-logs", false, "keep every proxy's log under --out/logs, one directory per run")
	out := fs.String("out", "bench-out", "directory for report.json, report.md and the plots")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if *merge != "" {
		var reports []*harness.Report
		for _, path := range split(*merge) {
			r, err := harness.ReadReport(path)
			if err != nil {
				fmt.Fprintf(os.Stderr, "kproxy-bench: --merge: %v\n", err)
				return 2
			}
			reports = append(reports, r)
		}
		r := harness.Merge(reports...)
		if err := harness.WriteReport(*out, r); err != nil {
			fmt.Fprintf(os.Stderr, "kproxy-bench: writing the report: %v\n", err)
			return 1
		}
		harness.Markdown(os.Stdout, r)
		fmt.Fprintf(os.Stderr, "kproxy-bench: merged report in %s\n", *out)
		return 0
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "kproxy-bench: run as root (it creates network namespaces)")
		return 2
	}
	cfg := harness.Config{Mix: cluster.Mix(*mix), Seed: *seed, Reps: *reps, Changes: *changes, FileChanges: *fileChanges, ChangeGap: *changeGap, Modes: split(*modes),
		Soak: *soak, SoakFor: *soakFor, SoakProxies: split(*soakProxies)}
	if *soakProfile {
		if err := os.MkdirAll(*out, 0o755); err != nil {
			fmt.Fprintf(os.Stderr, "kproxy-bench: %v\n", err)
			return 2
		}
		cfg.SoakProfile = *out
	}
	if *keepLogs {
		cfg.LogDir = filepath.Join(*out, "logs")
	}
	var errs []error
	for _, s := range split(*services) {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			errs = append(errs, fmt.Errorf("--services: %q is not a count", s))
		}
		cfg.Services = append(cfg.Services, n)
	}
	for _, w := range split(*what) {
		switch w {
		case "file":
			cfg.FileSource = true
		case "apiserver":
			cfg.APIServer = true
		case "dataplane":
			cfg.DataPlane = true
		default:
			errs = append(errs, fmt.Errorf("--measure: unknown %q", w))
		}
	}
	if cfg.Mix != cluster.Realistic && cfg.Mix != cluster.Plain {
		errs = append(errs, fmt.Errorf("--mix %q: want realistic or plain", cfg.Mix))
	}
	for _, p := range split(*proxies) {
		switch name, path, ok := strings.Cut(p, "="); {
		case ok:
			cfg.Proxies = append(cfg.Proxies, harness.Proxy{Name: name, Bin: path})
		case p == "kproxy":
			bin := *kproxyBin
			if bin == "" {
				var err error
				if bin, err = buildKproxy(); err != nil {
					errs = append(errs, err)
				} else {
					defer os.RemoveAll(filepath.Dir(bin))
				}
			}
			cfg.Proxies = append(cfg.Proxies, harness.Proxy{Name: "kproxy", Bin: bin})
		case p == "upstream":
			bin := *upstreamBin
			if bin == "" {
				dir, err := framework.BinDir()
				if err != nil {
					errs = append(errs, err)
				}
				bin = filepath.Join(dir, "kube-proxy")
			}
			cfg.Proxies = append(cfg.Proxies, harness.Proxy{Name: "upstream", Bin: bin})
		default:
			errs = append(errs, fmt.Errorf("--proxies: unknown %q (kproxy, upstream or NAME=PATH)", p))
		}
	}
	if err := errors.Join(append(errs, cfg.Validate())...); err != nil {
		fmt.Fprintf(os.Stderr, "kproxy-bench: %v\n", err)
		return 2
	}

	// The first interrupt ends the run after cleaning up (processes
	// stopped, namespaces deleted) and writes what was measured; a second
	// one exits at once (the children die with us: PDEATHSIG; namespaces
	// left are swept by the next run).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// finished ends the watcher on a normal return (it is closed before
	// the deferred stop() ends ctx, which is not an interrupt).
	finished := make(chan struct{})
	defer close(finished)
	go func() {
		select {
		case <-ctx.Done():
		case <-finished:
			return
		}
		stop()
		fmt.Fprintln(os.Stderr, "kproxy-bench: interrupted, cleaning up (again to exit at once)")
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		<-sig
		os.Exit(130)
	}()
	tb := harness.NewTB(ctx, os.Stderr, "kproxy-bench")
	var report *harness.Report
	if err := tb.Scope("run", func(tb *harness.TB) { report = harness.Run(tb, cfg) }); err != nil {
		fmt.Fprintf(os.Stderr, "kproxy-bench: %v\n", err)
		return 1
	}
	if err := harness.WriteReport(*out, report); err != nil {
		fmt.Fprintf(os.Stderr, "kproxy-bench: writing the report: %v\n", err)
		return 1
	}
	harness.Markdown(os.Stdout, report)
	fmt.Fprintf(os.Stderr, "kproxy-bench: report in %s\n", *out)
	if len(report.Errors) > 0 {
		return 1
	}
	return 0
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// buildKproxy builds ./cmd/kproxy of this checkout into a temporary file.
func buildKproxy() (string, error) {
	root, err := framework.RepoRoot()
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "kproxy-bench-bin-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "kproxy")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/kproxy")
	cmd.Dir = root
	if o, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building kproxy: %v\n%s", err, o)
	}
	return bin, nil
}
