package compat

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/kproxy/kproxy/test/e2e/framework"
)

// Upstream binaries test/tools/build.sh puts next to kube-apiserver.
const (
	kubeProxyBinary    = "kube-proxy"
	featureGatesBinary = "listgates"
)

var (
	// kproxyBin is kproxy built from this checkout; upstreamBin and
	// gatesBin are from the bin directory. "" when unavailable, with
	// unavailable saying why.
	kproxyBin, upstreamBin, gatesBin string
	unavailable                      string
)

func TestMain(m *testing.M) { os.Exit(runTests(m)) }

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "kproxy-compat-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "compat: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := setUp(dir); err != nil {
		if framework.Mandatory() {
			fmt.Fprintf(os.Stderr, "compat: %s=1 but: %v\n", framework.EnvRun, err)
			return 1
		}
		unavailable = err.Error()
		fmt.Fprintf(os.Stderr, "compat: tests will skip: %v\n", err)
	}
	return m.Run()
}

// setUp builds kproxy and finds (or, with KPROXY_E2E=1, builds) the upstream
// binaries.
func setUp(dir string) error {
	bin, err := framework.BinDir()
	if err != nil {
		return err
	}
	missing := func() bool {
		for _, b := range []string{kubeProxyBinary, featureGatesBinary} {
			if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
				return true
			}
		}
		return false
	}
	root, err := framework.RepoRoot()
	if err != nil {
		return err
	}
	if missing() {
		if !framework.Mandatory() {
			return fmt.Errorf("upstream kube-proxy not in %s: run test/tools/build.sh, or set %s=1 to build it on demand", bin, framework.EnvRun)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "test", "tools", "build.sh"))
		cmd.Env = append(os.Environ(), framework.EnvBinDir+"="+bin)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("test/tools/build.sh: %w\n%s", err, out)
		}
	}
	upstreamBin = filepath.Join(bin, kubeProxyBinary)
	gatesBin = filepath.Join(bin, featureGatesBinary)
	kproxyBin = filepath.Join(dir, "kproxy")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", kproxyBin, "./cmd/kproxy")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building kproxy: %w\n%s", err, b)
	}
	return nil
}

// needBinaries skips (or fails with KPROXY_E2E=1) when the binaries are
// missing.
func needBinaries(t *testing.T) {
	t.Helper()
	if unavailable != "" {
		t.Skip(unavailable)
	}
}

// needRoot skips (or fails with KPROXY_E2E=1) where network namespaces
// cannot be made.
func needRoot(t *testing.T) {
	t.Helper()
	needBinaries(t)
	if reason := framework.SkipReason(); reason != "" {
		if framework.Mandatory() {
			t.Fatalf("%s=1 but: %s", framework.EnvRun, reason)
		}
		t.Skip(reason)
	}
}

// output runs argv (bounded by timeout) and returns its combined output and
// exit error; a run still going at the timeout is killed and reported with
// timedOut.
func output(timeout time.Duration, argv ...string) (out string, timedOut bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.WaitDelay = 5 * time.Second
	b, err := cmd.CombinedOutput()
	return string(b), ctx.Err() != nil, err
}
