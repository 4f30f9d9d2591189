package nfnetlink

import (
	"fmt"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

// fullSyncShape is a transaction shaped like the nftables proxier's full
// sync of n ClusterIP services with 10 endpoints each: per service a
// chain, its masquerade rule and one numgen + DNAT rule per endpoint,
// and the elements of the cluster-ips, service-ips and hairpin sets.
// Addresses: 10.96.0.0/16 cluster IPs, 10.244.0.0/16 endpoints.
func fullSyncShape(n int) *nft.Transaction {
	tx := nft.NewTransaction(nft.IPv4, "kube-proxy")
	tx.Add(&nft.Table{})
	svcKey := []nft.DataType{nft.TypeIPv4Addr, nft.TypeInetProto, nft.TypeInetService}
	tx.Add(&nft.Set{Name: "cluster-ips", Key: []nft.DataType{nft.TypeIPv4Addr}, Comment: "Active ClusterIPs"})
	tx.Add(&nft.Set{Name: "service-ips", Key: svcKey, Data: nft.TypeVerdict})
	tx.Add(&nft.Set{Name: "hairpin", Key: []nft.DataType{nft.TypeIPv4Addr, nft.TypeIPv4Addr}})
	addr := func(b byte, i int) netip.Addr { return netip.AddrFrom4([4]byte{10, b, byte(i >> 8), byte(i)}) }
	var elems []*nft.Element
	for i := range n {
		chain := fmt.Sprintf("service-%08X-ns/svc-%d/tcp/http", i, i)
		comment := fmt.Sprintf("ns/svc-%d:http", i)
		vip := addr(96, i)
		tx.Add(&nft.Chain{Name: chain})
		tx.Add(&nft.Rule{Chain: chain, Stmts: []nft.Stmt{
			nft.MatchAddr{Prefixes: []netip.Prefix{netip.PrefixFrom(vip, 32)}}, nft.MatchDport{Proto: v1.ProtocolTCP, Port: 80},
			nft.MatchAddr{Source: true, Negate: true, Prefixes: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}},
			nft.SetMarkOr{Mask: 0x4000},
		}})
		for j := range 10 {
			ep := addr(244, (i*10+j)%65536)
			stmts := []nft.Stmt{nft.DNAT{Proto: v1.ProtocolTCP, To: netip.AddrPortFrom(ep, 8080)}}
			if j < 9 {
				stmts = append([]nft.Stmt{nft.MatchNumgen{Mod: uint32(10 - j), Value: 0}}, stmts...)
			}
			tx.Add(&nft.Rule{Chain: chain, Stmts: stmts})
			elems = append(elems, &nft.Element{Set: "hairpin", Key: []nft.Value{{Addr: ep}, {Addr: ep}}, Comment: comment})
		}
		tx.Add(&nft.Element{Set: "cluster-ips", Key: []nft.Value{{Addr: vip}}, Comment: comment})
		elems = append(elems, &nft.Element{Set: "service-ips", Key: []nft.Value{{Addr: vip}, {Proto: v1.ProtocolTCP}, {Port: 80}},
			Verdict: &nft.Verdict{Kind: nft.Goto, Chain: chain}, Comment: comment})
	}
	for _, e := range elems {
		tx.Add(e)
	}
	return tx
}

// BenchmarkLower: the user-space part of applying a full sync through
// netlink (turning the transaction into batch messages).
func BenchmarkLower(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			tx := fullSyncShape(n)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				l := newLowerer(tx, nil)
				if err := l.lower(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(tx.Len()), "ops")
		})
	}
}
