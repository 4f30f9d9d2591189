// Package iptables is kproxy's --proxy-mode iptables: upstream kube-proxy's
// chain layout (KUBE-SERVICES, KUBE-SVC-*, KUBE-SVL-*, KUBE-EXT-*, KUBE-FW-*,
// KUBE-SEP-*, KUBE-NODEPORTS, KUBE-EXTERNAL-SERVICES, KUBE-POSTROUTING,
// KUBE-MARK-MASQ, KUBE-FORWARD, KUBE-PROXY-FIREWALL, KUBE-PROXY-CANARY, and
// as upstream the kubelet's KUBE-FIREWALL hooked from INPUT and OUTPUT in
// both families) written with iptables-restore --noflush, through
// xtables.Interface, with either backend. As upstream, it never creates
// the kubelet's KUBE-IPTABLES-HINT.
//
// Render is pure: (Config, Input, Applied) → Plan, the exact restore input.
// Proxier.Sync is the only side effect: it reads the kernel before a full
// sync (iptables-save of nat and filter: stale chains, jump rules already
// there), renders, restores, then cleans UDP conntrack entries.
//
// A partial sync touches only the changed service ports: their own chains
// whose rules changed are rewritten, and their rules in the shared chains
// are deleted ("-D" by their exact text) and inserted one by one instead
// of rewriting KUBE-SERVICES. Every partial restore starts with
// "-F KUBE-PROXY-CANARY": if someone flushed the tables it fails, and the
// next sync is full.
//
// What a sync costs is set by the rules the kernel holds, not by what
// changed (measured at 10k services × 10 endpoints, see test/bench):
// iptables-legacy-restore reads and replaces the whole nat table (~100 MB
// in upstream's layout) on every run; iptables-nft's kernel validates every
// chain reachable from the nat table's hooks on every commit that adds a
// jump or NAT rule (~130 ms of CPU). iptables-nft also slows down with the
// square of the chains in one run, so large syncs are split into runs of
// at most MaxChainsPerRestore chains; legacy always gets one run.
// Options.CompactLayout (no KUBE-SEP chains) holds a third of the rules.
//
// Where things are: render.go (Config, Input, Render), applied.go (Applied,
// Plan, Commit), sync.go (full and partial sync), service.go (one service
// port's chains and rules), restore.go (putting the pieces into restore
// inputs, split by MaxChainsPerRestore; the canary), jumps.go (the jump
// rules from built-in chains), proxier.go (applying).
package iptables
