// Package trace holds what every tracer of kproxy shares: the packet
// (Packet), the node it meets (Host: local addresses, the kernel's ipsets
// and IPVS table), what becomes of it (Result, Outcome, the verdicts),
// the bound every walk keeps (ErrLimit) and the one error for a line of
// ruleset text (ParseError). The tracers sit beneath it, one per rule
// syntax:
//
//   - nftables walks an nf_tables ruleset (nft text, or nfttest.Fake's
//     state);
//   - iptables walks iptables-save text, with ipset matches and the IPVS
//     table for ipvs mode;
//   - savedstate reads what an ipvs mode node saves (ipvsadm -S, ipset
//     save) into this package's IPSet and IPVSService.
package trace
