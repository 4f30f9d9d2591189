// Package nftables answers "where does this packet go?" for an nftables
// ruleset given as text: the tests run it on what the nftables proxier
// renders, and `kproxy trace` runs it on what a live node holds. Behaviour
// is checked by following packets, not by matching rule text.
//
// # Input
//
// ParseNFT reads the `nft -f` text the nft package prints (one add, insert,
// create, flush or delete per line; nft.Read is the reader, shared with
// nfttest.Fake) and applies the operations in order with nftstate's
// applier, the one nfttest.Fake applies transactions with, so a full sync
// followed by partial syncs gives the state the kernel would hold. It
// refuses what the kernel refuses (a rule in a missing chain, a jump to a
// missing or base chain, deleting a chain something still jumps to, a map
// lookup whose key has the wrong shape, a loop, NAT at a hook that forbids
// it, ...), in nftstate's File dialect: the error names the line. Only the ip
// and ip6 families and the statements kproxy writes are understood; any
// other syntax is an error naming the line, never skipped, because a
// tracer that skipped a rule would describe a ruleset that does not exist.
// The nested form `nft list table` prints is accepted as well.
//
// # The model of the hooks
//
// Trace follows the first packet of a new connection (so "ct state new"
// always matches) through the netfilter hooks in kernel order:
//
//	from an interface:  prerouting -> routing -> input                 (local destination)
//	                                          -> forward -> postrouting (anything else)
//	from a local process:  output -> routing -> postrouting
//
// On each hook the base chains of every table of the packet's family run in
// priority order (kproxy's filter chains at dstnat-10 = -110 before its nat
// chains at -100, filter-output-post-dnat at -90 after them). Within a
// chain rules are evaluated in order; jump pushes and return (or the end of
// the chain) pops, goto replaces the current frame; at the bottom of the
// stack the base chain's policy (accept unless declared drop) applies.
// Accept ends the current base chain only: the next base chain on the hook
// still sees the packet. Drop and reject end the walk. DNAT and masquerade
// are terminal like in the kernel: they accept, ending the base chain. A
// verdict-map lookup that finds no element is a non-match and evaluation
// goes on with the next rule. "numgen random mod N" forks the walk: every
// branch is followed and becomes its own Outcome of probability 1/N (times
// the probability of the path that led there).
//
// NAT follows the conntrack rules: nat chains only act on a new connection,
// and once a nat chain of a hook has set up a binding (dnat on prerouting
// or output, masquerade on postrouting) the later nat chains of that hook
// are skipped. Routing uses the destination as DNAT left it, and filter
// chains after the nat chain see the rewritten destination. (NAT statements
// reached from a filter chain or from a hook the kernel forbids never get
// into a ruleset: the applier refuses them.)
//
// Session affinity: "update @set { ip saddr }" is recorded in the outcome
// as the nft operation that adds the source to the set; Remember (or Apply
// with hand-written elements) puts it into the ruleset so that the next
// trace from that source follows the "ip saddr @set" rule and sticks.
//
// Service names: the rules carry none, the elements that dispatch to a
// service's chains do (their comment is the service port,
// "ns/name:port/PROTO"). From the element lookup that sends the packet to
// a chain until the walk leaves that chain, each step of the path ends in
// " (service ns/name:port/PROTO)" (service.go), so that a shared chain
// ("cluster/tcp/2") still says whose packet it handles.
//
// Walks are bounded (MaxRuleEvaluations per path, MaxJumpDepth, and
// MaxOutcomes); exceeding a bound is an error wrapping ErrLimit.
//
// # What is not simulated
//
//   - Conntrack beyond "this is a new connection": no established or
//     related flows, no reply direction, no NAT of later packets, no
//     conntrack zones or helpers.
//   - Routing beyond local or not local: no routing tables, policy routing,
//     output interfaces, or rp_filter; "fib ... type local" means one of
//     Host.LocalAddrs or a loopback address. The address masquerade would
//     pick is not computed, only that masquerading happens.
//   - A locally generated packet to a local address re-enters through lo
//     (prerouting and input, with nat already bound); the tracer stops after
//     postrouting and does not walk that second pass.
//   - Other hooks and families (ingress, egress, bridge, inet, arp), chains
//     of type route, and iptables rules living beside nftables.
//   - Timeouts of dynamic sets: an element stays until deleted.
//   - The nat core's fixed hook priorities: nat chains are ordered among the
//     filter chains by their own priority, which matches the kernel for the
//     standard priorities kproxy uses.
package nftables
