package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/testutil/vm"
	"github.com/kproxy/kproxy/test/e2e/framework"
)

// kproxyBinary is the kproxy built by TestMain from this checkout, or the
// one envKproxy names; "" when the tests are going to skip anyway.
var kproxyBinary string

// envKproxy names a kproxy binary to test instead of building one: the VM
// suite (test/vmsuite) passes its own build, as the test VM's root file
// system is read-only and go cannot build there.
const envKproxy = "KPROXY_E2E_KPROXY"

func TestMain(m *testing.M) { os.Exit(runTests(m)) }

func runTests(m *testing.M) int {
	if reason := framework.SkipReason(); reason != "" {
		if framework.Mandatory() {
			fmt.Fprintf(os.Stderr, "e2e: %s=1 but: %s\n", framework.EnvRun, reason)
			return 1
		}
		fmt.Fprintf(os.Stderr, "e2e: tests will skip: %s\n", reason)
		return m.Run()
	}
	if vm.InVM() {
		// Emulated (no KVM), on a loaded host, kube-apiserver took
		// 6 minutes to become ready, and upstream's kube-proxy over 30 s
		// to its first sync.
		controlPlaneOptions.ReadyTimeout = 15 * time.Minute
		waitTimeout = 5 * time.Minute
	}
	kproxyBinary = os.Getenv(envKproxy)
	if kproxyBinary == "" {
		dir, err := os.MkdirTemp("", "kproxy-e2e-")
		if err != nil {
			fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
			return 1
		}
		defer os.RemoveAll(dir)
		kproxyBinary = filepath.Join(dir, "kproxy")
		if err := buildKproxy(kproxyBinary); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: building kproxy: %v\n", err)
			return 1
		}
	}
	code := m.Run()
	// The one control plane of this test binary, started by the first
	// test that needed it (sharedControlPlane).
	if err := framework.StopShared(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: stopping the shared control plane: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// buildKproxy builds cmd/kproxy of this checkout. `go test` puts its own
// GOROOT/bin first in PATH, so "go" is the toolchain running the tests.
func buildKproxy(out string) error {
	root, err := framework.RepoRoot()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/kproxy")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%w\n%s", err, b)
	}
	return nil
}
