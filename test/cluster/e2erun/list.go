package e2erun

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
)

// listLine is a line of `e2e.test --list-tests`: four spaces, the file and
// line of the test, ": ", its full text.
var listLine = regexp.MustCompile(`^    \S+:\d+: (.+)$`)

// ParseTestList reads the full texts of the tests `e2e.test --list-tests`
// prints, in its order (sorted by text).
func ParseTestList(out []byte) []string {
	var names []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if m := listLine.FindSubmatch(sc.Bytes()); m != nil {
			names = append(names, string(m[1]))
		}
	}
	return names
}

// ListTests runs `e2e.test --list-tests`, which needs no cluster.
func ListTests(ctx context.Context, e2eTest string) ([]string, error) {
	out, err := exec.CommandContext(ctx, e2eTest, "--list-tests").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list-tests: %w", e2eTest, err)
	}
	names := ParseTestList(out)
	if len(names) == 0 {
		return nil, fmt.Errorf("%s --list-tests listed no test", e2eTest)
	}
	return names, nil
}

// DryRun runs e2e.test with the selection's flags and --ginkgo.dry-run
// (no cluster is contacted) and returns the tests ginkgo would run: the
// specs its JUnit report marks passed. It is the check that the
// selection's patterns mean to ginkgo what Matcher says they do.
func DryRun(ctx context.Context, e2eTest, selection string) ([]string, error) {
	dir, err := os.MkdirTemp("", "e2erun-dry-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	o := Options{
		E2ETest: e2eTest, Kubectl: "kubectl", Kubeconfig: filepath.Join(dir, "none"),
		Selection: selection, ReportDir: dir, DryRun: true,
	}
	argv, err := o.Argv()
	if err != nil {
		return nil, err
	}
	if out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%s --ginkgo.dry-run: %w\n%s", e2eTest, err, tail(out, 2000))
	}
	cases, err := ReadJUnit(filepath.Join(dir, JUnitFile))
	if err != nil {
		return nil, err
	}
	var names []string
	for _, c := range cases {
		if c.Result == Passed {
			names = append(names, c.Name)
		}
	}
	slices.Sort(names)
	return names, nil
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
