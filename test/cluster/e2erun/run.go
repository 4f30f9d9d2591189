package e2erun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Options say how to run e2e.test.
type Options struct {
	// E2ETest is the path of e2e.test (test/tools/build.sh builds it),
	// Kubectl the kubectl the tests exec (kubectl exec into pods), Ginkgo
	// the ginkgo CLI, needed only when Procs > 1.
	E2ETest, Kubectl, Ginkgo string
	// Kubeconfig of the cluster's administrator.
	Kubeconfig string
	// NetNS is the network namespace e2e.test runs in: the cluster's
	// control-plane namespace, from which nodes, pods and node ports are
	// reachable. A name of `ip netns` or a path (/proc/PID/ns/net, a bind
	// mount); empty: the caller's own namespace.
	NetNS string
	// Selection names the tests (Selections).
	Selection string
	// ReportDir receives the JUnit report, RunFile and e2e.log.
	ReportDir string
	// Timeout of the whole suite (--ginkgo.timeout); 0: one hour.
	Timeout time.Duration
	// NumNodes the cluster has (--num-nodes); 0: the framework counts the
	// schedulable nodes itself.
	NumNodes int
	// Procs > 1 runs the tests in that many parallel e2e.test processes
	// (ginkgo --procs); [Serial] tests still run alone, at the end.
	Procs int
	// DryRun lists what would run without running it (--ginkgo.dry-run).
	DryRun bool
	// Proxy and Mode label the run in RunFile (and so in the tables).
	Proxy, Mode string
	// Command is the command line recorded in RunFile; empty: the argv
	// that runs e2e.test.
	Command string
	// Output receives e2e.test's output besides ReportDir/e2e.log (nil:
	// only the file).
	Output io.Writer
	// Extra arguments for e2e.test.
	Extra []string
}

// e2eArgs are e2e.test's own flags for o.
func (o Options) e2eArgs(sel Selection) []string {
	timeout := o.Timeout
	if timeout == 0 {
		timeout = time.Hour
	}
	args := []string{
		"--kubeconfig=" + o.Kubeconfig,
		// No cloud provider: tests that need one (cloud load balancers,
		// SSH to nodes) skip themselves.
		"--provider=skeleton",
		"--kubectl-path=" + o.Kubectl,
		"--report-dir=" + o.ReportDir,
		"--e2e-output-dir=" + filepath.Join(o.ReportDir, "output"),
		// Node logs come from the cluster harness, not over SSH.
		"--disable-log-dump",
		// Images are imported into every node beforehand; nothing is pulled.
		"--prepull-images=false",
		"--ginkgo.no-color",
		"--ginkgo.timeout=" + timeout.String(),
	}
	if o.NumNodes > 0 {
		args = append(args, "--num-nodes="+strconv.Itoa(o.NumNodes))
	}
	for _, f := range sel.Focus {
		args = append(args, "--ginkgo.focus="+f)
	}
	for _, s := range sel.skips() {
		args = append(args, "--ginkgo.skip="+s)
	}
	if o.DryRun {
		args = append(args, "--ginkgo.dry-run")
	}
	return append(args, o.Extra...)
}

// Argv is the command that runs e2e.test for o, inside o.NetNS.
func (o Options) Argv() ([]string, error) {
	sel, ok := Selections[o.Selection]
	if !ok {
		return nil, fmt.Errorf("no selection %q (have %s)", o.Selection, strings.Join(SelectionNames(), ", "))
	}
	if o.E2ETest == "" || o.Kubeconfig == "" || o.Kubectl == "" || o.ReportDir == "" {
		return nil, errors.New("e2e.test, kubectl, the kubeconfig and the report directory are all needed")
	}
	e2e := o.e2eArgs(sel)
	var argv []string
	if o.Procs > 1 && !o.DryRun {
		if o.Ginkgo == "" {
			return nil, errors.New("parallel runs need the ginkgo CLI")
		}
		// ginkgo's own flags replace e2e.test's --ginkgo.* ones.
		argv = []string{o.Ginkgo, "run", "--procs=" + strconv.Itoa(o.Procs), "--no-color"}
		var rest []string
		for _, a := range e2e {
			if g, ok := strings.CutPrefix(a, "--ginkgo."); ok {
				if g != "no-color" {
					argv = append(argv, "--"+g)
				}
				continue
			}
			rest = append(rest, a)
		}
		argv = append(argv, o.E2ETest, "--")
		argv = append(argv, rest...)
	} else {
		argv = append([]string{o.E2ETest}, e2e...)
	}
	return inNetNS(o.NetNS, argv), nil
}

// inNetNS prefixes argv so that it runs in network namespace ns: an `ip
// netns` name or a path; "" is the caller's own.
func inNetNS(ns string, argv []string) []string {
	switch {
	case ns == "":
		return argv
	case strings.Contains(ns, "/"):
		return append([]string{"nsenter", "--net=" + ns, "--"}, argv...)
	default:
		return append([]string{"ip", "netns", "exec", ns}, argv...)
	}
}

// nodeCountArgv is the kubectl command that lists o's cluster's nodes, one
// name per line, from o.NetNS.
func (o Options) nodeCountArgv() []string {
	return inNetNS(o.NetNS, []string{o.Kubectl, "--kubeconfig=" + o.Kubeconfig, "get", "nodes", "-o", "name"})
}

// CountNodes returns the number of nodes the cluster of o has. With
// --num-nodes unset, e2e.test counts them only in the ginkgo process that
// runs the suite's set-up; the other parallel processes see -1, and tests
// that need two nodes skip themselves there ("Requires at least 2 nodes
// (not -1)"), by the chance of which process runs them.
func CountNodes(ctx context.Context, o Options) (int, error) {
	argv := o.nodeCountArgv()
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).Output()
	if err != nil {
		return 0, fmt.Errorf("counting the nodes (%s): %w", shellJoin(argv), err)
	}
	n := nodeNames(string(out))
	if n == 0 {
		return 0, fmt.Errorf("counting the nodes (%s): the cluster has none", shellJoin(argv))
	}
	return n, nil
}

// nodeNames counts the node/NAME lines of `kubectl get nodes -o name`.
func nodeNames(out string) int {
	n := 0
	for _, l := range strings.Fields(out) {
		if strings.HasPrefix(l, "node/") {
			n++
		}
	}
	return n
}

// Execute runs e2e.test as o says and records the run in
// ReportDir/RunFile. A run in which tests failed returns the Run and an
// *exec.ExitError; one that could not start, another error.
func Execute(ctx context.Context, o Options) (Run, error) {
	argv, err := o.Argv()
	if err != nil {
		return Run{}, err
	}
	if err := os.MkdirAll(filepath.Join(o.ReportDir, "output"), 0o755); err != nil {
		return Run{}, err
	}
	logf, err := os.Create(filepath.Join(o.ReportDir, "e2e.log"))
	if err != nil {
		return Run{}, err
	}
	defer logf.Close()
	run := Run{Selection: o.Selection, Proxy: o.Proxy, Mode: o.Mode, Command: o.Command}
	if run.Command == "" {
		run.Command = shellJoin(argv)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var out io.Writer = logf
	if o.Output != nil {
		out = io.MultiWriter(logf, o.Output)
	}
	cmd.Stdout, cmd.Stderr = out, out
	// The tests' kubectl finds the cluster by --kubeconfig; KUBECONFIG too
	// for anything they exec without it.
	cmd.Env = append(os.Environ(), "KUBECONFIG="+o.Kubeconfig)
	// A cancelled run gets SIGINT first, so ginkgo writes its report.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 2 * time.Minute
	run.Started = time.Now()
	runErr := cmd.Run()
	run.Finished = time.Now()
	if cmd.ProcessState == nil {
		// e2e.test did not start: no run to record.
		return Run{}, runErr
	}
	run.ExitCode = cmd.ProcessState.ExitCode()
	b, err := json.MarshalIndent(run, "", "  ")
	if err != nil {
		return run, err
	}
	if err := os.WriteFile(filepath.Join(o.ReportDir, RunFile), append(b, '\n'), 0o644); err != nil {
		return run, err
	}
	return run, runErr
}

// shellJoin quotes argv for a POSIX shell.
func shellJoin(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=./:,@+") == "" {
			q[i] = a
		} else {
			q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(q, " ")
}
