package e2erun

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func baseOptions() Options {
	return Options{
		E2ETest: "/bin/e2e.test", Kubectl: "/bin/kubectl", Ginkgo: "/bin/ginkgo",
		Kubeconfig: "/k/admin.conf", Selection: "conformance-services", ReportDir: "/r",
		Timeout: 10 * time.Minute,
	}
}

func TestArgv(t *testing.T) {
	sel := Selections["conformance-services"]
	var skips []string
	for _, s := range sel.skips() {
		skips = append(skips, "--ginkgo.skip="+s)
	}
	common := []string{
		"--kubeconfig=/k/admin.conf", "--provider=skeleton", "--kubectl-path=/bin/kubectl",
		"--report-dir=/r", "--e2e-output-dir=/r/output", "--disable-log-dump", "--prepull-images=false",
		"--ginkgo.no-color", "--ginkgo.timeout=10m0s",
	}
	focus := "--ginkgo.focus=" + sel.Focus[0]
	for _, tc := range []struct {
		name string
		edit func(*Options)
		want []string
	}{{
		name: "in the caller's namespace",
		want: slices.Concat([]string{"/bin/e2e.test"}, common, []string{focus}, skips),
	}, {
		name: "in a named namespace, with nodes and extra flags",
		edit: func(o *Options) { o.NetNS = "kc-cp"; o.NumNodes = 3; o.Extra = []string{"--ginkgo.v"} },
		want: slices.Concat([]string{"ip", "netns", "exec", "kc-cp", "/bin/e2e.test"}, common, []string{"--num-nodes=3", focus}, skips, []string{"--ginkgo.v"}),
	}, {
		name: "in a namespace by path, dry run",
		edit: func(o *Options) { o.NetNS = "/proc/42/ns/net"; o.DryRun = true; o.Procs = 4 },
		want: slices.Concat([]string{"nsenter", "--net=/proc/42/ns/net", "--", "/bin/e2e.test"}, common, []string{focus}, skips, []string{"--ginkgo.dry-run"}),
	}, {
		name: "parallel: ginkgo's flags go to the ginkgo CLI",
		edit: func(o *Options) { o.Procs = 4 },
		want: slices.Concat(
			[]string{"/bin/ginkgo", "run", "--procs=4", "--no-color", "--timeout=10m0s", "--focus=" + sel.Focus[0]},
			func() []string {
				var s []string
				for _, k := range skips {
					s = append(s, strings.Replace(k, "--ginkgo.", "--", 1))
				}
				return s
			}(),
			[]string{"/bin/e2e.test", "--"}, common[:7]),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			o := baseOptions()
			if tc.edit != nil {
				tc.edit(&o)
			}
			got, err := o.Argv()
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("argv (-want +got):\n%s", d)
			}
		})
	}
}

func TestArgvErrors(t *testing.T) {
	for name, edit := range map[string]func(*Options){
		"unknown selection":       func(o *Options) { o.Selection = "all" },
		"no kubeconfig":           func(o *Options) { o.Kubeconfig = "" },
		"no report directory":     func(o *Options) { o.ReportDir = "" },
		"parallel without ginkgo": func(o *Options) { o.Procs = 2; o.Ginkgo = "" },
	} {
		o := baseOptions()
		edit(&o)
		if _, err := o.Argv(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestExecute runs a stand-in e2e.test that writes a JUnit report and
// fails, and checks the run record, the log and the error.
func TestExecute(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "e2e.test")
	script := `#!/bin/sh
for a in "$@"; do case "$a" in --report-dir=*) d="${a#--report-dir=}";; esac; done
echo "args: $*"
echo "KUBECONFIG=$KUBECONFIG"
cp "` + filepath.Join(mustAbs(t, "testdata"), "junit_sample.xml") + `" "$d/junit_01.xml"
exit 1
`
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	o := baseOptions()
	o.E2ETest = fake
	o.ReportDir = filepath.Join(dir, "report")
	o.Proxy, o.Mode, o.Command = "kproxy", "nftables", "hack/conformance.sh run --mode nftables"
	run, err := Execute(context.Background(), o)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("Execute error = %v, want exit status 1", err)
	}
	if run.ExitCode != 1 || run.Finished.Before(run.Started) {
		t.Errorf("run = %+v", run)
	}
	b, err := os.ReadFile(filepath.Join(o.ReportDir, RunFile))
	if err != nil {
		t.Fatal(err)
	}
	var rec Run
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	if rec.Proxy != "kproxy" || rec.Mode != "nftables" || rec.Command != o.Command || rec.Selection != "conformance-services" || rec.ExitCode != 1 {
		t.Errorf("run.json = %+v", rec)
	}
	log, err := os.ReadFile(filepath.Join(o.ReportDir, "e2e.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "--provider=skeleton") || !strings.Contains(string(log), "KUBECONFIG=/k/admin.conf") {
		t.Errorf("e2e.log = %q", log)
	}
	r, err := ReadReport(o.ReportDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Cases) != 4 || r.Run.Mode != "nftables" {
		t.Errorf("ReadReport = %d cases, run %+v", len(r.Cases), r.Run)
	}
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestShellJoin(t *testing.T) {
	got := shellJoin([]string{"ip", "netns", "exec", "a b", "--ginkgo.focus=\\[sig-network\\] it's"})
	want := `ip netns exec 'a b' '--ginkgo.focus=\[sig-network\] it'\''s'`
	if got != want {
		t.Errorf("shellJoin = %s, want %s", got, want)
	}
}

// TestCountNodes: the node count comes from kubectl with the run's
// kubeconfig; a cluster without nodes or a failing kubectl is an error,
// not a count of 0 (which would leave e2e.test's parallel processes at -1).
func TestCountNodes(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "kubectl")
	script := `#!/bin/sh
[ "$1" = --kubeconfig=/k/admin.conf ] && [ "$2 $3 $4 $5" = "get nodes -o name" ] || exit 3
printf '%s' "$KC_OUT"
`
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	o := baseOptions()
	o.Kubectl = fake
	o.NetNS = ""
	for _, tc := range []struct {
		out     string
		want    int
		wantErr bool
	}{
		{out: "node/node1\nnode/node2\nnode/node3\n", want: 3},
		{out: "node/node1", want: 1},
		{out: "", wantErr: true},
	} {
		t.Setenv("KC_OUT", tc.out)
		n, err := CountNodes(context.Background(), o)
		if (err != nil) != tc.wantErr || n != tc.want {
			t.Errorf("kubectl printing %q: CountNodes = %d, %v; want %d (error %v)", tc.out, n, err, tc.want, tc.wantErr)
		}
	}
	o.Kubeconfig = "/other"
	if _, err := CountNodes(context.Background(), o); err == nil {
		t.Errorf("a failing kubectl gave no error")
	}
	o.NetNS = "kc-cp"
	if got := o.nodeCountArgv()[:4]; !slices.Equal(got, []string{"ip", "netns", "exec", "kc-cp"}) {
		t.Errorf("nodeCountArgv = %q, want it in the control plane's netns", got)
	}
}
