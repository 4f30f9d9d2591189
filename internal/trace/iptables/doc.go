// Package iptables answers "where does this packet go?" for an iptables
// ruleset given as iptables-save text, the way package nftables does for
// nftables: the iptables proxier's tests run it on what the proxier
// restores, and `kproxy trace` runs it on what a live node holds. It
// returns trace.Result and trace.Outcome, so both tracers report alike.
//
// # Input
//
// Parse reads iptables-save output (or iptables-restore input) into empty
// tables; Apply restores more input with or without --noflush, so a full
// restore followed by kube-proxy's partial restores gives the state the
// kernel would hold: declared user chains are flushed (or created), -X
// deletes, -A/-I/-R/-D/-F/-N/-P/-Z work as on the command line, each table
// is committed at its COMMIT. The restore itself is package
// internal/kernel/xtables/restore, the simulator xtablestest's fake runs
// too; this package parses the rules it stores for evaluation. What
// iptables-restore or the kernel would refuse is an error naming the
// line: a rule in a missing chain, a jump to a missing or built-in chain,
// deleting a chain that still has rules or is still jumped to, a loop
// between chains, DNAT outside PREROUTING/OUTPUT, MASQUERADE outside
// POSTROUTING, REJECT outside INPUT/FORWARD/OUTPUT or the filter table,
// "-m tcp" without "-p tcp", addresses of both families.
//
// Only what kube-proxy writes is understood: -s -d -i -o -p (with "!"),
// the matches tcp/udp/sctp (--dport, --sport, --syn, --tcp-flags), addrtype
// (--src-type, --dst-type), comment, mark, conntrack (--ctstate) and
// state, statistic (--mode random), recent (--set, --rcheck) and nfacct;
// the targets ACCEPT, DROP, RETURN, jumps, gotos, REJECT, MARK, DNAT and
// MASQUERADE. Any other match, target or option is an error wrapping
// ErrUnsupported, never skipped: a tracer that skipped a rule would
// describe a ruleset that does not exist. A ruleset holds one family, as
// iptables-save or ip6tables-save prints it; the addresses tell which
// (Family), and tracing a packet of the other family is an error.
//
// # The model of the hooks
//
// Trace follows the first packet of a new connection through the netfilter
// hooks in kernel order:
//
//	from an interface:     PREROUTING -> routing -> INPUT                  (local destination)
//	                                             -> FORWARD -> POSTROUTING (anything else)
//	from a local process:  OUTPUT -> routing -> POSTROUTING
//	                          [-> PREROUTING -> INPUT through lo, if the destination is local]
//
// On each hook the tables run in the kernel's fixed priority order: raw
// (-300), conntrack (-200), mangle (-150), nat for DNAT (-100), filter (0),
// security (50), nat for SNAT (100). So the filter table sees the
// destination DNAT chose, and masquerading comes last. Within a chain rules
// are evaluated in order, the header fields (-s -d -i -o -p) first and the
// matches in the order written; a jump pushes the chain, RETURN or the end
// of a chain pops it, a goto replaces the current chain; at the built-in
// chain the policy applies. ACCEPT ends the table's chain on this hook
// only; the next table still sees the packet. DROP and REJECT end the
// walk. DNAT and MASQUERADE accept, ending the nat chain.
//
// Conntrack: the packet opens a new connection. In the raw table (before
// conntrack) its state is INVALID, afterwards NEW, plus DNAT once DNAT
// changed its destination and SNAT once masqueraded; RELATED and
// ESTABLISHED never match. A TCP packet carries SYN alone (--syn matches). The nat table runs once per direction: after a
// nat chain of PREROUTING or OUTPUT finished (with or without DNAT) the
// destination binding is set up and no later nat chain of those hooks
// runs; likewise INPUT and POSTROUTING for the source. That is why the
// loopback pass of a locally generated packet skips nat.
//
// Routing: a destination is local if it is in Host.LocalAddrs or a
// loopback address ("-m addrtype --dst-type LOCAL" uses the same test).
// IPv4 packets from an interface other than lo to or from 127.0.0.0/8 are
// dropped as martian unless Ruleset.RouteLocalnet is set (the sysctl
// kube-proxy sets for localhost NodePorts); with it set they reach INPUT,
// where kube-proxy's KUBE-FIREWALL rule drops those not DNATed. IPv6
// drops ::1 from other interfaces before PREROUTING.
//
// Statistic forks the walk: the branch where the match fails continues
// with the next rule, the other continues matching; each branch's
// probability is the kernel's own (the probability as a 31-bit fraction),
// so kube-proxy's 1/3, 1/2, 1 give three outcomes of 1/3. Outcomes come in
// rule order (first endpoint first).
//
// Session affinity: "-m recent --set" is reported in
// Outcome.AffinityUpdates as the command that adds the address by hand
// ("echo +10.0.0.5 > /proc/net/xt_recent/KUBE-SEP-..."); Remember (or
// AddRecent) puts it into the ruleset so that the next trace from that
// source matches "--rcheck" and sticks.
// A persistent IPVS virtual server (ipvs mode's ClientIP affinity) reports
// the persistence template its connection creates the same way; Remember
// keeps it, and the client's next connections to that virtual server go to
// that real server while it takes connections (no timeout either).
//
// Walks are bounded (Limits: rule evaluations per path, jump depth,
// outcomes); exceeding a bound is an error wrapping trace.ErrLimit.
//
// # What is not simulated
//
//   - Conntrack beyond "this is a new connection": no established or
//     related flows, no reply direction, no later packets, no zones,
//     helpers or conntrack marks.
//   - Routing beyond local or not local: no routing tables, policy
//     routing, rp_filter or ip_forward=0. The output interface is known
//     only for a local process's packet to a local address (lo); a rule
//     testing -o on a routed packet is an error. The address MASQUERADE
//     picks is not computed, only that it happens.
//   - Addresses per interface (addrtype --limit-iface-in/out), route types
//     other than local, unicast, broadcast and multicast.
//   - Timeouts of recent lists (--seconds, --reap): an address stays until
//     the ruleset is rebuilt.
//   - The mangle table's reroute after a mark change, the security
//     table's SELinux context, ip6tables extension headers, fragments.
//   - nftables rules living beside iptables (iptables-nft's own tables run
//     at the same priorities; other nft tables are not seen).
package iptables
