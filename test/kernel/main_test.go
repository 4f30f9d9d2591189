package kernel

import (
	"fmt"
	"os"
	"testing"

	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// kproxyBin is the kproxy binary built for this test run; empty when the
// kernel tests cannot run here (they skip, saying why).
var kproxyBin string

// kproxyFaultBin is kproxy built with the faultinject tag; empty when not
// built (KPROXY_KERNEL_TEST_BIN given).
var kproxyFaultBin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if netns.Missing("nft") != "" {
		// Every test skips with the reason; nothing to build.
		return m.Run()
	}
	if bin := os.Getenv("KPROXY_KERNEL_TEST_BIN"); bin != "" {
		// A prebuilt kproxy (for example one with a feature disabled, to
		// see that a test catches it).
		kproxyBin = bin
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "kproxy-kernel-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	kproxyBin, err = netns.BuildBinary("./cmd/kproxy", dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "building kproxy for the kernel tests: %v\n", err)
		return 1
	}
	// The same with fault injection (cmd/kproxy/faultinject.go), for the
	// tests of a kernel that refuses some of kproxy's rules.
	kproxyFaultBin, err = netns.BuildBinaryTags("./cmd/kproxy", dir, "faultinject")
	if err != nil {
		fmt.Fprintf(os.Stderr, "building kproxy with fault injection for the kernel tests: %v\n", err)
		return 1
	}
	return m.Run()
}

// requireKernel skips unless the kernel tests can run.
func requireKernel(t *testing.T) {
	t.Helper()
	netns.Require(t, "nft")
	if kproxyBin == "" {
		t.Skip("kernel test skipped: kproxy was not built")
	}
}
