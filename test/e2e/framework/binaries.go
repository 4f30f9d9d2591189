package framework

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"
)

// Environment variables the end-to-end tests read.
const (
	// EnvRun set to 1 makes the tests mandatory: missing control-plane
	// binaries are built (test/tools/build.sh) and anything that keeps
	// the tests from running is a failure instead of a skip. CI sets it.
	EnvRun = "KPROXY_E2E"
	// EnvBinDir overrides where the control-plane binaries are
	// (default: <repo>/_output/bin); test/tools/build.sh reads it too.
	EnvBinDir = "KPROXY_E2E_BIN"
)

// Names of the control-plane binaries in the binary directory.
const (
	EtcdBinary      = "etcd"
	APIServerBinary = "kube-apiserver"
)

// buildTimeout bounds an on-demand build: a cold kube-apiserver build is
// about 10 minutes on 2 cores.
const buildTimeout = 30 * time.Minute

// Mandatory reports whether EnvRun asks for the end-to-end tests to run
// (and fail rather than skip).
func Mandatory() bool { return os.Getenv(EnvRun) == "1" }

// RepoRoot is the directory of kproxy's go.mod, found upwards from the
// working directory (a test runs in its package directory).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(b, []byte("module github.com/kproxy/kproxy\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("kproxy's go.mod not found above the working directory")
		}
		dir = parent
	}
}

// BinDir is where the control-plane binaries are expected.
func BinDir() (string, error) {
	if d := os.Getenv(EnvBinDir); d != "" {
		return filepath.Abs(d)
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "_output", "bin"), nil
}

// missingBinaries lists the control-plane binaries not present in dir.
func missingBinaries(dir string) []string {
	var missing []string
	for _, b := range []string{EtcdBinary, APIServerBinary} {
		if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			missing = append(missing, b)
		}
	}
	return missing
}

// SkipReason says why the end-to-end tests cannot run on this machine as it
// is, or "" if they can. It never builds anything: with EnvRun=1 missing
// binaries are not a reason (Start builds them).
func SkipReason() string {
	if os.Geteuid() != 0 {
		return "end-to-end tests need root (network namespaces, nftables); CI runs them as root"
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Sprintf("end-to-end tests need %q in PATH (iproute2, nftables)", tool)
		}
	}
	dir, err := BinDir()
	if err != nil {
		return err.Error()
	}
	if m := missingBinaries(dir); len(m) > 0 && !Mandatory() {
		return fmt.Sprintf("control-plane binaries %v not in %s: run test/tools/build.sh "+
			"(about 10 minutes the first time), or set %s=1 to build them on demand", m, dir, EnvRun)
	}
	return ""
}

var (
	buildOnce sync.Once
	buildErr  error
)

// ensureBinaries returns the binary directory, building the binaries with
// test/tools/build.sh (once per test binary) if any is missing.
func ensureBinaries() (string, error) {
	dir, err := BinDir()
	if err != nil {
		return "", err
	}
	if len(missingBinaries(dir)) == 0 {
		return dir, nil
	}
	buildOnce.Do(func() {
		root, err := RepoRoot()
		if err != nil {
			buildErr = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "test", "tools", "build.sh"))
		cmd.Env = append(os.Environ(), EnvBinDir+"="+dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("test/tools/build.sh: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		return "", buildErr
	}
	if m := missingBinaries(dir); len(m) > 0 {
		return "", fmt.Errorf("test/tools/build.sh succeeded but %v are still missing in %s", m, dir)
	}
	return dir, nil
}
