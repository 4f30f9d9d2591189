// Package netns is a harness for kernel tests that send real traffic through
// a proxy's rules: it creates network namespaces, links them with veth pairs
// and bridges into a small cluster (an outside client, nodes with a pod
// bridge, pods), runs in-process echo servers and clients inside them, and
// runs the proxy under test as a subprocess in a node's namespace.
//
// Nothing here knows which proxy mode is tested: tests pass the command line
// and decide themselves when the rules are in place (for example by polling
// `nft list table` or `iptables-save` with NS.Exec and Eventually).
//
// Rules the harness keeps:
//   - Every namespace is named Prefix + a random id + a role, so parallel
//     test binaries never collide, and every namespace, process and socket
//     it creates is removed with t.Cleanup, also when the test fails.
//   - Nothing is created in the namespace of the test process: veth pairs are
//     created inside a test namespace with their peer directly in another
//     one, so the root namespace's interfaces never carry test traffic.
//   - Sockets are created by a goroutine whose OS thread has entered the
//     namespace (runtime.LockOSThread + setns). A socket stays in the
//     namespace it was created in, so it is then used from any goroutine.
//     The thread is never unlocked: when the goroutine ends, the Go runtime
//     destroys the thread instead of reusing it in the wrong namespace.
//   - Every wait is bounded in time; every loop in count.
//
// Tests skip (Require) when not root or when `ip` (and any further tools
// asked for) are missing.
package netns
