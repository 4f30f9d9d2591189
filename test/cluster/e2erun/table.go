package e2erun

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// RunFile is the name of the record Run writes beside e2e.test's JUnit
// report in a run's report directory.
const RunFile = "run.json"

// JUnitFile is the JUnit report e2e.test writes in its --report-dir.
const JUnitFile = "junit_01.xml"

// Run records one e2e.test run: what ran against which proxy and mode, and
// the command that made it.
type Run struct {
	Selection string `json:"selection"`
	// Proxy is "kproxy" or "upstream" (kube-proxy v1.37.2), Mode the proxy
	// mode ("nftables", "iptables-legacy", "iptables-nft", "ipvs").
	Proxy string `json:"proxy"`
	Mode  string `json:"mode"`
	// Command is the command line that made the run, as a user types it.
	Command  string    `json:"command"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	// ExitCode of e2e.test (1 when a test failed).
	ExitCode int `json:"exitCode"`
}

// Report is a run and its test cases.
type Report struct {
	Dir   string
	Run   Run
	Cases []Case
}

// ReadReport reads a run's report directory: RunFile and JUnitFile.
func ReadReport(dir string) (Report, error) {
	r := Report{Dir: dir}
	b, err := os.ReadFile(filepath.Join(dir, RunFile))
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(b, &r.Run); err != nil {
		return r, fmt.Errorf("%s: %w", filepath.Join(dir, RunFile), err)
	}
	if r.Run.Proxy == "" || r.Run.Mode == "" {
		return r, fmt.Errorf("%s names no proxy or mode", filepath.Join(dir, RunFile))
	}
	r.Cases, err = ReadJUnit(filepath.Join(dir, JUnitFile))
	return r, err
}

// Column is one (mode, proxy) pair of the table.
type Column struct{ Mode, Proxy string }

// Table holds one row per test and one column per mode and proxy.
type Table struct {
	Columns []Column
	// Reports are the runs, in the order they finished.
	Reports []Report
	Rows    []Row
}

// Row is one test's results, one per column.
type Row struct {
	Name    string
	Results []Result
	// Messages are the skip or failure messages, one per column.
	Messages []string
}

// proxyOrder puts upstream before kproxy within a mode.
func proxyOrder(p string) int {
	switch p {
	case "upstream":
		return 0
	case "kproxy":
		return 1
	}
	return 2
}

// NewTable merges reports into a table: columns sorted by mode, upstream
// before kproxy; rows sorted by test name. Where two runs of one column hold
// the same test, the one that finished later gives its result.
func NewTable(reports []Report) Table {
	reports = slices.Clone(reports)
	slices.SortStableFunc(reports, func(a, b Report) int { return a.Run.Finished.Compare(b.Run.Finished) })
	t := Table{Reports: reports}
	for _, r := range reports {
		c := Column{r.Run.Mode, r.Run.Proxy}
		if !slices.Contains(t.Columns, c) {
			t.Columns = append(t.Columns, c)
		}
	}
	slices.SortFunc(t.Columns, func(a, b Column) int {
		return cmp.Or(strings.Compare(a.Mode, b.Mode), cmp.Compare(proxyOrder(a.Proxy), proxyOrder(b.Proxy)), strings.Compare(a.Proxy, b.Proxy))
	})
	rows := map[string]*Row{}
	for _, r := range reports {
		col := slices.Index(t.Columns, Column{r.Run.Mode, r.Run.Proxy})
		for _, c := range r.Cases {
			row := rows[c.Name]
			if row == nil {
				row = &Row{Name: c.Name, Results: make([]Result, len(t.Columns)), Messages: make([]string, len(t.Columns))}
				rows[c.Name] = row
			}
			row.Results[col], row.Messages[col] = c.Result, c.Message
		}
	}
	for _, row := range rows {
		t.Rows = append(t.Rows, *row)
	}
	slices.SortFunc(t.Rows, func(a, b Row) int { return strings.Compare(a.Name, b.Name) })
	return t
}

// Difference is a test whose result with kproxy differs from upstream's in
// one mode.
type Difference struct {
	Test, Mode       string
	Upstream, KProxy Result
	UpstreamMessage  string
	KProxyMessage    string
}

// Regressions are the tests that passed with upstream and did not pass with
// kproxy (failed, or skipped where upstream ran), in a mode both ran.
func (t Table) Regressions() []Difference {
	return t.compare(func(up, kp Result) bool { return up == Passed && kp != Passed && kp != NotRun })
}

// BothFailed are the tests that failed with upstream and with kproxy in the
// same mode: the environment's part, which docs/conformance.md explains.
func (t Table) BothFailed() []Difference {
	return t.compare(func(up, kp Result) bool { return up == Failed && kp == Failed })
}

func (t Table) compare(match func(up, kp Result) bool) []Difference {
	var out []Difference
	for _, row := range t.Rows {
		for i, c := range t.Columns {
			if c.Proxy != "upstream" {
				continue
			}
			j := slices.Index(t.Columns, Column{c.Mode, "kproxy"})
			if j < 0 {
				continue
			}
			if match(row.Results[i], row.Results[j]) {
				out = append(out, Difference{
					Test: row.Name, Mode: c.Mode,
					Upstream: row.Results[i], KProxy: row.Results[j],
					UpstreamMessage: row.Messages[i], KProxyMessage: row.Messages[j],
				})
			}
		}
	}
	return out
}

// cell is how a result reads in the table.
func cell(r Result) string {
	switch r {
	case Passed:
		return "pass"
	case Failed:
		return "**FAIL**"
	case Skipped:
		return "skip"
	}
	return "–"
}

// count tallies a report's results.
func count(cases []Case) (passed, failed, skipped int) {
	for _, c := range cases {
		switch c.Result {
		case Passed:
			passed++
		case Failed:
			failed++
		default:
			skipped++
		}
	}
	return
}

// mdEscape keeps a test name or message from breaking a Markdown table.
func mdEscape(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ", "<", "&lt;", ">", "&gt;").Replace(s)
}

// WriteMarkdown writes docs/conformance.md: the runs and the commands that
// made them, kproxy's results against upstream's, one row per test, and the
// tests skipped by name with their reasons. generator is the command that
// wrote the file.
func (t Table) WriteMarkdown(w io.Writer, generator string, skips []NamedSkip) error {
	var b strings.Builder
	b.WriteString("# Upstream's sig-network e2e tests: kproxy and kube-proxy\n\n")
	fmt.Fprintf(&b, "Generated by `%s` from the JUnit reports of the runs below; do not edit by hand.\n", generator)
	b.WriteString("Each run is upstream's `e2e.test` v1.37.2 against the test cluster of `hack/cluster.sh`,\n")
	b.WriteString("with kube-proxy v1.37.2 (upstream) or kproxy deployed from `deploy/kproxy.yaml` as the proxy.\n\n")

	b.WriteString("## Runs\n\n| Mode | Proxy | Selection | Passed | Failed | Skipped | Took | Command |\n|---|---|---|---:|---:|---:|---:|---|\n")
	for _, r := range t.Reports {
		p, f, s := count(r.Cases)
		fmt.Fprintf(&b, "| %s | %s | %s | %d | %d | %d | %s | `%s` |\n", r.Run.Mode, r.Run.Proxy, r.Run.Selection, p, f, s,
			r.Run.Finished.Sub(r.Run.Started).Round(time.Second), mdEscape(r.Run.Command))
	}

	b.WriteString("\n## kproxy against upstream\n\n")
	if reg := t.Regressions(); len(reg) == 0 {
		b.WriteString("Every test that passed with upstream kube-proxy passed with kproxy in the same mode.\n")
	} else {
		fmt.Fprintf(&b, "%d tests passed with upstream kube-proxy and not with kproxy:\n\n| Mode | Test | kproxy | Message |\n|---|---|---|---|\n", len(reg))
		for _, d := range reg {
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", d.Mode, mdEscape(d.Test), cell(d.KProxy), mdEscape(d.KProxyMessage))
		}
	}
	if both := t.BothFailed(); len(both) > 0 {
		fmt.Fprintf(&b, "\nFailed with both proxies (%d; the environment's part):\n\n| Mode | Test | Upstream's failure | kproxy's failure |\n|---|---|---|---|\n", len(both))
		for _, d := range both {
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", d.Mode, mdEscape(d.Test), mdEscape(d.UpstreamMessage), mdEscape(d.KProxyMessage))
		}
	}

	b.WriteString("\n## Results\n\n`pass`, `**FAIL**`, `skip` (the test skipped itself), `–` (not in that run's selection).\n\n| Test |")
	for _, c := range t.Columns {
		fmt.Fprintf(&b, " %s %s |", c.Mode, c.Proxy)
	}
	b.WriteString("\n|---|")
	b.WriteString(strings.Repeat("---|", len(t.Columns)))
	b.WriteString("\n")
	for _, row := range t.Rows {
		fmt.Fprintf(&b, "| %s |", mdEscape(row.Name))
		for _, r := range row.Results {
			fmt.Fprintf(&b, " %s |", cell(r))
		}
		b.WriteString("\n")
	}

	if len(skips) > 0 {
		b.WriteString("\n## Not run: tests that reach outside the cluster\n\nThe runner skips these by name (`--ginkgo.skip`); the cluster has no route out of its sandbox.\n\n| Test (regular expression) | Reason |\n|---|---|\n")
		for _, s := range skips {
			fmt.Fprintf(&b, "| `%s` | %s |\n", mdEscape(s.Pattern), mdEscape(s.Reason))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
