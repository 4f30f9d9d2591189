//go:build faultinject

package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
)

// faultEnv names the text whose operations the kernel is made to refuse:
// an nftables operation whose nft -f text contains it, or an
// iptables-restore input with a line that contains it, fails as the
// kernel or the tool would fail it (EINVAL on that operation, "line N
// failed"). "*" refuses every operation.
const faultEnv = "KPROXY_FAULT_REFUSE"

// faultFileEnv names a file that holds that text instead, read again at
// every operation: a test turns the fault on and off while kproxy runs
// (netlink errors that come and go). A missing or empty file refuses
// nothing.
const faultFileEnv = "KPROXY_FAULT_REFUSE_FILE"

func init() {
	marker, file := os.Getenv(faultEnv), os.Getenv(faultFileEnv)
	var match func(string) bool
	switch {
	case marker != "":
		klog.InfoS("Fault injection: the kernel refuses operations that mention a text", "text", marker)
		match = func(s string) bool { return marker == "*" || strings.Contains(s, marker) }
	case file != "":
		klog.InfoS("Fault injection: the kernel refuses operations that mention the text in a file", "file", file)
		match = func(s string) bool {
			b, err := os.ReadFile(file)
			m := strings.TrimSpace(string(b))
			if err != nil || m == "" {
				return false
			}
			return m == "*" || strings.Contains(s, m)
		}
	default:
		return
	}
	wrapNFT = func(i nft.Interface) nft.Interface { return refusingNFT{Interface: i, match: match} }
	wrapXtables = func(i xtables.Interface) xtables.Interface { return refusingXtables{Interface: i, match: match} }
}

type refusingNFT struct {
	nft.Interface
	match func(string) bool
}

func (r refusingNFT) Apply(ctx context.Context, tx *nft.Transaction) error {
	for i := range tx.Ops {
		if text := tx.OpText(i); r.match(text) {
			return &nft.OpError{Index: i, Op: text, Message: "refused by fault injection", Err: syscall.EINVAL}
		}
	}
	return r.Interface.Apply(ctx, tx)
}

// Check refuses as Apply does, so that failure isolation's check-only
// trials see the same kernel.
func (r refusingNFT) Check(ctx context.Context, tx *nft.Transaction) error {
	for i := range tx.Ops {
		if text := tx.OpText(i); r.match(text) {
			return &nft.OpError{Index: i, Op: text, Message: "refused by fault injection", Err: syscall.EINVAL}
		}
	}
	if c, ok := r.Interface.(nft.Checker); ok {
		return c.Check(ctx, tx)
	}
	return nil
}

type refusingXtables struct {
	xtables.Interface
	match func(string) bool
}

func (r refusingXtables) Restore(ctx context.Context, data []byte, opts xtables.RestoreOptions) error {
	_, err := r.RestoreWithStats(ctx, data, opts)
	return err
}

func (r refusingXtables) RestoreWithStats(ctx context.Context, data []byte, opts xtables.RestoreOptions) (xtables.RestoreStats, error) {
	for n, line := range strings.Split(string(data), "\n") {
		if r.match(line) {
			return xtables.RestoreStats{}, &xtables.RestoreError{Backend: r.Backend(), Family: r.Family(), Line: n + 1,
				Detail: fmt.Sprintf("line %d failed (refused by fault injection)", n+1), Err: syscall.EINVAL}
		}
	}
	return r.Interface.RestoreWithStats(ctx, data, opts)
}
