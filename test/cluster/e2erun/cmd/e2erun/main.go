// Command e2erun runs upstream's e2e tests (e2e.test v1.37.2, built by
// test/tools/build.sh) against the test cluster, lists what a selection
// runs, and writes docs/conformance.md from the runs' reports. It is what
// hack/conformance.sh runs; see test/cluster/e2erun for the selections.
//
//	e2erun run --selection conformance-services --kubeconfig K --netns NS --report-dir D --proxy kproxy --mode nftables
//	e2erun list --selection sig-network [--verify]
//	e2erun doc --out docs/conformance.md [--notes FILE] REPORT-DIR...
//	e2erun latency LABEL=SCRAPE...
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kproxy/kproxy/test/cluster/e2erun"
	"github.com/kproxy/kproxy/test/e2e/framework"
)

func main() { os.Exit(run()) }

func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRootCommand().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		return 1
	}
	return 0
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "e2erun",
		Short:         "Run upstream's sig-network e2e tests against the test cluster and tabulate the results",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newRunCommand(), newListCommand(), newDocCommand(), newLatencyCommand())
	return root
}

// binary is NAME in the binaries' directory (KPROXY_E2E_BIN, else
// _output/bin of the repository).
func binary(name string) string {
	dir, err := framework.BinDir()
	if err != nil {
		return name
	}
	return filepath.Join(dir, name)
}

func selectionHelp() string {
	var b strings.Builder
	for _, n := range e2erun.SelectionNames() {
		fmt.Fprintf(&b, "  %s: %s\n", n, e2erun.Selections[n].Doc)
	}
	return b.String()
}

func newRunCommand() *cobra.Command {
	o := e2erun.Options{}
	cmd := &cobra.Command{
		Use:   "run [flags] [-- e2e.test flags]",
		Short: "Run a selection of e2e tests; the JUnit report, e2e.log and run.json go to --report-dir",
		Long:  "Selections:\n" + selectionHelp(),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Extra = args
			o.Output = cmd.OutOrStdout()
			if o.Command == "" {
				o.Command = strings.Join(os.Args, " ")
			}
			if o.NumNodes == 0 && o.Procs > 1 && !o.DryRun {
				n, err := e2erun.CountNodes(cmd.Context(), o)
				if err != nil {
					return err
				}
				o.NumNodes = n
			}
			r, err := e2erun.Execute(cmd.Context(), o)
			if r.Finished.IsZero() {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "e2erun: %s (%s, %s) finished in %s, exit status %d; report in %s\n",
				o.Selection, o.Proxy, o.Mode, r.Finished.Sub(r.Started).Round(time.Second), r.ExitCode, o.ReportDir)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Selection, "selection", "conformance-services", "which tests (see above)")
	f.StringVar(&o.E2ETest, "e2e-test", binary("e2e.test"), "upstream's e2e.test")
	f.StringVar(&o.Kubectl, "kubectl", binary("kubectl"), "the kubectl the tests exec")
	f.StringVar(&o.Ginkgo, "ginkgo", binary("ginkgo"), "the ginkgo CLI (for --procs > 1)")
	f.StringVar(&o.Kubeconfig, "kubeconfig", "", "the cluster administrator's kubeconfig (required)")
	f.StringVar(&o.NetNS, "netns", "", "network namespace to run e2e.test in: an `ip netns` name or a path (the cluster's control-plane namespace)")
	f.StringVar(&o.ReportDir, "report-dir", "", "directory for the JUnit report, e2e.log and run.json (required)")
	f.DurationVar(&o.Timeout, "timeout", time.Hour, "time limit of the whole run (--ginkgo.timeout)")
	f.IntVar(&o.NumNodes, "num-nodes", 0, "number of nodes (--num-nodes; 0: counted with kubectl before the run)")
	f.IntVar(&o.Procs, "procs", 1, "parallel e2e.test processes (ginkgo --procs); [Serial] tests still run alone")
	f.BoolVar(&o.DryRun, "dry-run", false, "list what would run (--ginkgo.dry-run) instead of running it")
	f.StringVar(&o.Proxy, "proxy", "kproxy", "the proxy the cluster runs, for the report: kproxy or upstream")
	f.StringVar(&o.Mode, "mode", "nftables", "the proxy's mode, for the report: nftables, iptables-legacy, iptables-nft, ipvs")
	f.StringVar(&o.Command, "record-command", "", "the command line recorded in run.json (default: this command's)")
	_ = cmd.MarkFlagRequired("kubeconfig")
	_ = cmd.MarkFlagRequired("report-dir")
	return cmd
}

func newListCommand() *cobra.Command {
	var selection, e2eTest string
	var verify bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "Print the tests a selection runs (from e2e.test --list-tests), then their count",
		Long: "Selections:\n" + selectionHelp() + "\nWith --verify, also runs e2e.test --ginkgo.dry-run with the selection's " +
			"flags and fails when ginkgo would run other tests than the list.",
		RunE: func(cmd *cobra.Command, _ []string) error {
			sel, ok := e2erun.Selections[selection]
			if !ok {
				return fmt.Errorf("no selection %q", selection)
			}
			m, err := sel.Matcher()
			if err != nil {
				return err
			}
			all, err := e2erun.ListTests(cmd.Context(), e2eTest)
			if err != nil {
				return err
			}
			chosen := m.Filter(all)
			for _, n := range chosen {
				fmt.Fprintln(cmd.OutOrStdout(), n)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "%s: %d of %d tests\n", selection, len(chosen), len(all))
			if !verify {
				return nil
			}
			dry, err := e2erun.DryRun(cmd.Context(), e2eTest, selection)
			if err != nil {
				return err
			}
			want := slices.Sorted(slices.Values(chosen))
			if !slices.Equal(dry, want) {
				return fmt.Errorf("ginkgo's dry run selects %d tests, the list %d:\n%s", len(dry), len(want), diff(want, dry))
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "%s: ginkgo's dry run selects the same %d tests\n", selection, len(dry))
			return nil
		},
	}
	cmd.Flags().StringVar(&selection, "selection", "conformance-services", "which tests")
	cmd.Flags().StringVar(&e2eTest, "e2e-test", binary("e2e.test"), "upstream's e2e.test")
	cmd.Flags().BoolVar(&verify, "verify", false, "check the list against ginkgo's dry run")
	return cmd
}

// diff lists the names in only one of a (listed) and b (dry run).
func diff(a, b []string) string {
	var s strings.Builder
	for _, n := range a {
		if !slices.Contains(b, n) {
			fmt.Fprintf(&s, "  only listed:  %s\n", n)
		}
	}
	for _, n := range b {
		if !slices.Contains(a, n) {
			fmt.Fprintf(&s, "  only dry run: %s\n", n)
		}
	}
	return s.String()
}

func newDocCommand() *cobra.Command {
	var out, notes string
	cmd := &cobra.Command{
		Use:   "doc [flags] REPORT-DIR...",
		Short: "Write docs/conformance.md from the report directories of several runs (mode × proxy)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, dirs []string) error {
			var reports []e2erun.Report
			for _, d := range dirs {
				r, err := e2erun.ReadReport(d)
				if err != nil {
					return err
				}
				reports = append(reports, r)
			}
			t := e2erun.NewTable(reports)
			var b strings.Builder
			gen := "hack/conformance.sh doc " + strings.Join(dirs, " ")
			if notes != "" {
				gen = "hack/conformance.sh doc --notes " + notes + " " + strings.Join(dirs, " ")
			}
			if err := t.WriteMarkdown(&b, gen, e2erun.AllNamedSkips()); err != nil {
				return err
			}
			if notes != "" {
				n, err := os.ReadFile(notes)
				if err != nil {
					return err
				}
				b.WriteString("\n")
				b.Write(n)
			}
			if out == "-" {
				_, err := fmt.Fprint(cmd.OutOrStdout(), b.String())
				return err
			}
			if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s: %d tests, %d runs, %d regressions against upstream\n", out, len(t.Rows), len(t.Reports), len(t.Regressions()))
			return nil
		},
	}
	cmd.Flags().StringVarP(&out, "out", "o", "docs/conformance.md", "the file to write (- for standard output)")
	cmd.Flags().StringVar(&notes, "notes", "", "a Markdown file appended to the tables (how the runs were made, what the environment lacks)")
	return cmd
}

func newLatencyCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "latency LABEL=SCRAPE...",
		Short: "Print a Markdown table of network programming latency (count, p50, p99) from scraped /metrics files",
		Long: "Each SCRAPE is the text of one or more /metrics scrapes (say every node's proxy, concatenated); " +
			"the buckets of " + e2erun.LatencyMetric + " are added up over all series, and p50 and p99 estimated " +
			"as Prometheus's histogram_quantile does.",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			w := cmd.OutOrStdout()
			fmt.Fprintln(w, "| Proxy | Observations | p50 | p99 | Mean |\n|---|---:|---:|---:|---:|")
			for _, a := range args {
				label, path, ok := strings.Cut(a, "=")
				if !ok {
					return fmt.Errorf("%q: want LABEL=FILE", a)
				}
				f, err := os.Open(path)
				if err != nil {
					return err
				}
				h, err := e2erun.ReadHistogram(f, e2erun.LatencyMetric)
				f.Close()
				if err != nil {
					return fmt.Errorf("%s: %w", path, err)
				}
				fmt.Fprintf(w, "| %s | %.0f | %.3f s | %.3f s | %.3f s |\n", label, h.Total(), h.Quantile(0.5), h.Quantile(0.99), h.Mean())
			}
			return nil
		},
	}
}
