// Package kernel holds kproxy's real-kernel tests: each test builds a small
// cluster of network namespaces (an outside client, two nodes with pod
// bridges, one namespace per pod) with internal/testutil/netns, runs the
// kproxy binary in the node namespaces with a snapshot file as its source,
// and sends real TCP and UDP traffic through the rules kproxy programs.
//
// The tests need root and the `ip` and `nft` binaries; without them they skip
// with a message. CI runs them as root. Run them alone with
//
//	go test -count=1 ./test/kernel/
//
// KPROXY_KERNEL_TEST_BIN=/path/to/kproxy tests that binary instead of
// building ./cmd/kproxy. Set KPROXY_KERNEL_TEST_DUMP=1 to see the nftables ruleset of every node of
// a failed test.
package kernel
