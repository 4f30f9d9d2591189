// Package doctor is `kproxy doctor`: it reads what this host holds for
// each proxy mode (iptables backends and kube-proxy's chains in them, the
// nftables mode's tables, IPVS state and leftovers, other netfilter users,
// sysctls, what a running proxy answers) without changing anything
// (gatherFacts), turns those facts into findings (diagnose, pure and
// tested without a host), and prints both (printFacts).
package doctor
