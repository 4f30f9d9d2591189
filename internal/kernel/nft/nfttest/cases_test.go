package nfttest

// Cases shared by the fake's unit tests and the kernel conformance test,
// which runs them against the real kernel to prove the fake rejects what
// the kernel rejects.
//
// Address ranges:
//   10.96.0.0/16   service cluster IPs
//   10.244.0.0/16  pod (endpoint) IPs
//   192.168.0.0/16 node addresses
//   fd00::/8       IPv6 addresses where a wrong family is needed

import (
	"net/netip"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

const tbl = "kproxy-fake"

var (
	svc1 = netip.MustParseAddr("10.96.0.1")
	svc2 = netip.MustParseAddr("10.96.0.2")
	pod1 = netip.MustParseAddr("10.244.0.11")
	v6   = netip.MustParseAddr("fd00::1")
)

func svcKey(a netip.Addr, p v1.Protocol, port uint16) []nft.Value {
	return []nft.Value{{Addr: a}, {Proto: p}, {Port: port}}
}

func pfx(s string) nft.Value { return nft.Value{Prefix: netip.MustParsePrefix(s)} }

// baseTx is the state every case starts from.
func baseTx() *nft.Transaction {
	tx := nft.NewTransaction(nft.IPv4, tbl)
	tx.Add(&nft.Table{Comment: "base"})
	tx.Add(
		&nft.Chain{Name: "nat-prerouting", Type: nft.TypeNAT, Hook: nft.HookPrerouting, Priority: nft.PriorityDstNAT},
		&nft.Chain{Name: "nat-postrouting", Type: nft.TypeNAT, Hook: nft.HookPostrouting, Priority: nft.PrioritySrcNAT},
		&nft.Chain{Name: "filter-input", Type: nft.TypeFilter, Hook: nft.HookInput, Priority: -110},
		&nft.Chain{Name: "services"},
		&nft.Chain{Name: "svc", Comment: "a service"},
		&nft.Chain{Name: "ep"},
		&nft.Chain{Name: "masq"},
		&nft.Chain{Name: "unused"},
		&nft.Chain{Name: "via-map"},
	)
	tx.Add(
		&nft.Set{Name: "ips", Key: []nft.DataType{nft.TypeIPv4Addr}, Comment: "cluster IPs"},
		&nft.Set{Name: "ranges", Key: []nft.DataType{nft.TypeIPv4Addr}, Interval: true},
		&nft.Set{Name: "svcmap", Key: []nft.DataType{nft.TypeIPv4Addr, nft.TypeInetProto, nft.TypeInetService}, Data: nft.TypeVerdict},
		&nft.Set{Name: "nodeports", Key: []nft.DataType{nft.TypeInetProto, nft.TypeInetService}, Data: nft.TypeVerdict},
		&nft.Set{Name: "aff", Key: []nft.DataType{nft.TypeIPv4Addr}, Dynamic: true, Timeout: time.Hour},
		&nft.Set{Name: "tmap", Key: []nft.DataType{nft.TypeIPv4Addr}, Data: nft.TypeVerdict, Timeout: 10 * time.Second},
	)
	tx.Add(
		&nft.Element{Set: "ips", Key: []nft.Value{{Addr: svc1}}},
		&nft.Element{Set: "ranges", Key: []nft.Value{pfx("10.0.0.0/16")}, Comment: "r"},
		&nft.Element{Set: "svcmap", Key: svcKey(svc1, v1.ProtocolTCP, 80), Verdict: &nft.Verdict{Kind: nft.Goto, Chain: "svc"}},
		&nft.Element{Set: "nodeports", Key: []nft.Value{{Proto: v1.ProtocolTCP}, {Port: 30000}}, Verdict: &nft.Verdict{Kind: nft.Goto, Chain: "via-map"}},
	)
	tx.Add(
		&nft.Rule{Chain: "nat-prerouting", Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Jump, Chain: "services"}}},
		&nft.Rule{Chain: "nat-postrouting", Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Jump, Chain: "masq"}}},
		&nft.Rule{Chain: "masq", Stmts: []nft.Stmt{nft.Masquerade{}}},
		&nft.Rule{Chain: "services", Stmts: []nft.Stmt{nft.VmapLookup{Fields: []nft.Field{nft.FieldDaddr, nft.FieldL4Proto, nft.FieldDport}, Map: "svcmap"}}},
		&nft.Rule{Chain: "services", Stmts: []nft.Stmt{nft.MatchFibLocal{}, nft.VmapLookup{Fields: []nft.Field{nft.FieldL4Proto, nft.FieldDport}, Map: "nodeports"}}},
		&nft.Rule{Chain: "svc", Stmts: []nft.Stmt{nft.NumgenVmap{Chains: []string{"ep"}}}},
		&nft.Rule{Chain: "ep", Stmts: []nft.Stmt{nft.UpdateSaddr{Set: "aff"}}},
		&nft.Rule{Chain: "ep", Stmts: []nft.Stmt{nft.DNAT{Proto: v1.ProtocolTCP, To: netip.AddrPortFrom(pod1, 8080)}}},
		&nft.Rule{Chain: "filter-input", Stmts: []nft.Stmt{nft.MatchAddr{Set: "ips"}, nft.Counter{}}},
	)
	return tx
}

type fakeCase struct {
	name  string
	build func(tx *nft.Transaction)
	// errno is what the kernel answers; 0 means the transaction applies.
	errno unix.Errno
	// index is the operation the error names (-1: the whole
	// transaction); checked only when checkIndex is set.
	index      int
	checkIndex bool
	// fakeStricter marks checks the fake makes although the kernel
	// accepts the transaction: a lookup whose fields have the length of
	// the map's key but not its types is accepted by the kernel (it only
	// checks registers) but can never match as intended.
	fakeStricter bool
}

func el(set string, key []nft.Value, v *nft.Verdict) *nft.Element {
	return &nft.Element{Set: set, Key: key, Verdict: v}
}

func gotoV(c string) *nft.Verdict { return &nft.Verdict{Kind: nft.Goto, Chain: c} }

var dropV = &nft.Verdict{Kind: nft.Drop}

func rule(chain string, stmts ...nft.Stmt) *nft.Rule { return &nft.Rule{Chain: chain, Stmts: stmts} }

func epMap(name string, p v1.Protocol) *nft.Set { return &nft.Set{Name: name, Endpoints: p} }

func epElem(set string, idx uint32, to netip.AddrPort) *nft.Element {
	return &nft.Element{Set: set, Index: idx, To: to}
}

func svcEpMap(name string, p v1.Protocol) *nft.Set {
	return &nft.Set{Name: name, Endpoints: p, ByService: true}
}

func svcEpElem(set string, svc netip.Addr, port uint16, idx uint32, to netip.AddrPort) *nft.Element {
	return &nft.Element{Set: set, Key: []nft.Value{{Addr: svc}, {Port: port}}, Index: idx, To: to}
}

var fakeCases = []fakeCase{
	// Endpoint maps.
	{name: "endpoint map, its rule and elements", build: func(tx *nft.Transaction) {
		tx.Add(epMap("eps", v1.ProtocolTCP), &nft.Chain{Name: "svc2"})
		tx.Add(rule("svc2", nft.DNATMap{Proto: v1.ProtocolTCP, Mod: 2, Offset: 5, Map: "eps"}))
		tx.Add(epElem("eps", 5, netip.AddrPortFrom(pod1, 80)), epElem("eps", 6, netip.AddrPortFrom(pod1, 81)))
		tx.Delete(epElem("eps", 5, netip.AddrPortFrom(pod1, 80)))
		tx.Add(rule("services", nft.Verdict{Kind: nft.Goto, Chain: "svc2"}))
	}},
	{name: "endpoint map key taken with other data", errno: unix.EEXIST, index: 2, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(epMap("eps", v1.ProtocolUDP))
		tx.Add(epElem("eps", 5, netip.AddrPortFrom(pod1, 80)), epElem("eps", 5, netip.AddrPortFrom(pod1, 81)))
	}},
	{name: "delete a missing endpoint map element", errno: unix.ENOENT, index: 1, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(epMap("eps", v1.ProtocolUDP))
		tx.Delete(epElem("eps", 5, netip.AddrPortFrom(pod1, 80)))
	}},
	{name: "endpoint element in a plain set", errno: unix.EINVAL, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(epElem("ips", 5, netip.AddrPortFrom(pod1, 80)))
	}},
	{name: "dnat map rule on a verdict map", errno: unix.ENODATA, build: func(tx *nft.Transaction) {
		tx.Add(rule("svc", nft.DNATMap{Proto: v1.ProtocolTCP, Mod: 2, Map: "svcmap"}))
	}},
	{name: "dnat map rule on a missing map", errno: unix.ENOENT, build: func(tx *nft.Transaction) {
		tx.Add(rule("svc", nft.DNATMap{Proto: v1.ProtocolTCP, Mod: 2, Map: "nope"}))
	}},
	// nft refuses this ("conflicting protocols"), and so does lowering.
	{name: "dnat map rule of another protocol", errno: unix.EINVAL, build: func(tx *nft.Transaction) {
		tx.Add(epMap("eps", v1.ProtocolTCP))
		tx.Add(rule("svc", nft.DNATMap{Proto: v1.ProtocolUDP, Mod: 2, Map: "eps"}))
	}},
	// Endpoint maps keyed by service.
	{name: "endpoint map keyed by service, its rule and elements", build: func(tx *nft.Transaction) {
		tx.Add(svcEpMap("ceps", v1.ProtocolTCP), &nft.Chain{Name: "cluster-tcp-2"})
		tx.Add(rule("cluster-tcp-2", nft.DNATByService{Proto: v1.ProtocolTCP, Mod: 2, Map: "ceps"}))
		tx.Add(svcEpElem("ceps", svc1, 80, 0, netip.AddrPortFrom(pod1, 80)), svcEpElem("ceps", svc1, 80, 1, netip.AddrPortFrom(pod1, 81)))
		// Same index, another service: another key.
		tx.Add(svcEpElem("ceps", svc2, 80, 1, netip.AddrPortFrom(pod1, 82)))
		tx.Delete(svcEpElem("ceps", svc1, 80, 1, netip.AddrPortFrom(pod1, 81)))
		tx.Add(svcEpElem("ceps", svc1, 80, 1, netip.AddrPortFrom(pod1, 83)))
		tx.Add(rule("services", nft.Verdict{Kind: nft.Goto, Chain: "cluster-tcp-2"}))
	}},
	{name: "keyed endpoint map key taken with other data", errno: unix.EEXIST, index: 2, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(svcEpMap("ceps", v1.ProtocolUDP))
		tx.Add(svcEpElem("ceps", svc1, 53, 0, netip.AddrPortFrom(pod1, 53)), svcEpElem("ceps", svc1, 53, 0, netip.AddrPortFrom(pod1, 54)))
	}},
	{name: "delete a missing keyed endpoint map element", errno: unix.ENOENT, index: 2, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(svcEpMap("ceps", v1.ProtocolUDP))
		tx.Add(svcEpElem("ceps", svc1, 53, 0, netip.AddrPortFrom(pod1, 53)))
		tx.Delete(svcEpElem("ceps", svc1, 54, 0, netip.AddrPortFrom(pod1, 53)))
	}},
	{name: "unkeyed element in a keyed endpoint map", errno: unix.EINVAL, index: 1, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(svcEpMap("ceps", v1.ProtocolUDP))
		tx.Add(epElem("ceps", 0, netip.AddrPortFrom(pod1, 53)))
	}},
	{name: "keyed element in an endpoint map", errno: unix.EINVAL, index: 1, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(epMap("eps", v1.ProtocolUDP))
		tx.Add(svcEpElem("eps", svc1, 53, 0, netip.AddrPortFrom(pod1, 53)))
	}},
	{name: "keyed element of the wrong family", errno: unix.EINVAL, index: 1, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(svcEpMap("ceps", v1.ProtocolUDP))
		tx.Add(svcEpElem("ceps", v6, 53, 0, netip.AddrPortFrom(pod1, 53)))
	}},
	{name: "service dnat rule on an unkeyed endpoint map", errno: unix.EINVAL, build: func(tx *nft.Transaction) {
		tx.Add(epMap("eps", v1.ProtocolTCP))
		tx.Add(rule("svc", nft.DNATByService{Proto: v1.ProtocolTCP, Mod: 2, Map: "eps"}))
	}},
	{name: "dnat map rule on a keyed endpoint map", errno: unix.EINVAL, build: func(tx *nft.Transaction) {
		tx.Add(svcEpMap("ceps", v1.ProtocolTCP))
		tx.Add(rule("svc", nft.DNATMap{Proto: v1.ProtocolTCP, Mod: 2, Map: "ceps"}))
	}},
	{name: "service dnat rule of another protocol", errno: unix.EINVAL, build: func(tx *nft.Transaction) {
		tx.Add(svcEpMap("ceps", v1.ProtocolTCP))
		tx.Add(rule("svc", nft.DNATByService{Proto: v1.ProtocolSCTP, Mod: 2, Map: "ceps"}))
	}},
	{name: "service dnat rule on a missing map", errno: unix.ENOENT, build: func(tx *nft.Transaction) {
		tx.Add(rule("svc", nft.DNATByService{Proto: v1.ProtocolTCP, Mod: 2, Map: "nope"}))
	}},
	// Elements.
	{name: "add a new element", build: func(tx *nft.Transaction) {
		tx.Add(el("svcmap", svcKey(svc2, v1.ProtocolUDP, 53), gotoV("svc")))
	}},
	{name: "re-add an element with the same verdict", build: func(tx *nft.Transaction) {
		tx.Add(el("svcmap", svcKey(svc1, v1.ProtocolTCP, 80), gotoV("svc")))
	}},
	{name: "re-add an element with another verdict", errno: unix.EEXIST, index: 1, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(el("ips", []nft.Value{{Addr: svc2}}, nil))
		tx.Add(el("svcmap", svcKey(svc1, v1.ProtocolTCP, 80), dropV))
	}},
	{name: "two verdicts for one new key", errno: unix.EEXIST, index: 1, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(el("svcmap", svcKey(svc2, v1.ProtocolTCP, 80), dropV))
		tx.Add(el("svcmap", svcKey(svc2, v1.ProtocolTCP, 80), gotoV("svc")))
	}},
	{name: "delete and re-add with another verdict", build: func(tx *nft.Transaction) {
		tx.Delete(el("svcmap", svcKey(svc1, v1.ProtocolTCP, 80), nil))
		tx.Add(el("svcmap", svcKey(svc1, v1.ProtocolTCP, 80), dropV))
	}},
	{name: "element of a missing set", errno: unix.ENOENT, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(el("nope", []nft.Value{{Addr: svc2}}, nil))
	}},
	{name: "element with too few key components", errno: unix.EINVAL, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(el("svcmap", []nft.Value{{Addr: svc2}, {Proto: v1.ProtocolTCP}}, dropV))
	}},
	{name: "element with a port where a protocol belongs", errno: unix.EINVAL, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(el("nodeports", []nft.Value{{Port: 6}, {Port: 80}}, dropV))
	}},
	{name: "element of the wrong family", errno: unix.EINVAL, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(el("ips", []nft.Value{{Addr: v6}}, nil))
	}},
	{name: "prefix in a set without interval flag", errno: unix.EINVAL, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(el("ips", []nft.Value{pfx("10.96.0.0/16")}, nil))
	}},
	{name: "map element without verdict", errno: unix.EINVAL, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(el("svcmap", svcKey(svc2, v1.ProtocolTCP, 80), nil))
	}},
	{name: "set element with a verdict", errno: unix.EINVAL, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(el("ips", []nft.Value{{Addr: svc2}}, dropV))
	}},
	{name: "map element to a missing chain", errno: unix.ENOENT, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(el("svcmap", svcKey(svc2, v1.ProtocolTCP, 80), gotoV("nope")))
	}},
	{name: "map element to a base chain", errno: unix.EOPNOTSUPP, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(el("svcmap", svcKey(svc2, v1.ProtocolTCP, 80), gotoV("filter-input")))
	}},
	{name: "delete a missing element", errno: unix.ENOENT, index: 1, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Delete(el("ips", []nft.Value{{Addr: svc1}}, nil))
		tx.Delete(el("ips", []nft.Value{{Addr: svc1}}, nil))
	}},
	{name: "overlapping interval", errno: unix.EEXIST, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(el("ranges", []nft.Value{pfx("10.0.1.0/24")}, nil))
	}},
	{name: "same interval again, and a prefix with host bits", build: func(tx *nft.Transaction) {
		tx.Add(el("ranges", []nft.Value{pfx("10.0.0.0/16")}, nil))
		tx.Add(el("ranges", []nft.Value{pfx("10.1.2.3/16")}, nil))
	}},
	{name: "delete an interval", build: func(tx *nft.Transaction) {
		tx.Delete(el("ranges", []nft.Value{pfx("10.0.0.0/16")}, nil))
		tx.Add(el("ranges", []nft.Value{{Addr: svc1}}, nil))
	}},
	{name: "delete part of an interval", errno: unix.ENOENT, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Delete(el("ranges", []nft.Value{pfx("10.0.0.0/24")}, nil))
	}},

	// Rules.
	{name: "rule in a missing chain", errno: unix.ENOENT, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(rule("nope", nft.Counter{}))
	}},
	{name: "jump to a missing chain", errno: unix.ENOENT, index: 1, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(rule("unused", nft.Counter{}))
		tx.Add(rule("unused", nft.Verdict{Kind: nft.Jump, Chain: "nope"}))
	}},
	{name: "goto a base chain", errno: unix.EOPNOTSUPP, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(rule("unused", nft.Verdict{Kind: nft.Goto, Chain: "nat-postrouting"}))
	}},
	{name: "numgen to a missing chain", errno: unix.ENOENT, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(rule("unused", nft.NumgenVmap{Chains: []string{"ep", "nope"}}))
	}},
	{name: "lookup in a missing set", errno: unix.ENOENT, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(rule("unused", nft.MatchAddr{Set: "nope"}, nft.Verdict{Kind: nft.Accept}))
	}},
	{name: "vmap of a missing map", errno: unix.ENOENT, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(rule("unused", nft.VmapLookup{Fields: []nft.Field{nft.FieldDaddr}, Map: "nope"}))
	}},
	{name: "update of a missing set", errno: unix.ENOENT, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(rule("unused", nft.UpdateSaddr{Set: "nope"}))
	}},
	{name: "update of an interval set", errno: unix.EOPNOTSUPP, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(rule("unused", nft.UpdateSaddr{Set: "ranges"}))
	}},
	{name: "lookup in a map's keys", build: func(tx *nft.Transaction) {
		tx.Add(&nft.Set{Name: "amap", Key: []nft.DataType{nft.TypeIPv4Addr}, Data: nft.TypeVerdict})
		tx.Add(rule("unused", nft.MatchAddr{Set: "amap"}, nft.Verdict{Kind: nft.Accept}))
	}},
	{name: "vmap fields shorter than the key", errno: unix.ENODATA, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(rule("unused", nft.VmapLookup{Fields: []nft.Field{nft.FieldL4Proto, nft.FieldDport}, Map: "svcmap"}))
	}},
	{name: "vmap fields in the wrong order", errno: unix.EINVAL, fakeStricter: true, build: func(tx *nft.Transaction) {
		tx.Add(rule("unused", nft.VmapLookup{Fields: []nft.Field{nft.FieldDport, nft.FieldL4Proto}, Map: "nodeports"}))
	}},
	{name: "address of the wrong family", errno: unix.EINVAL, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(rule("unused", nft.MatchAddr{Prefixes: []netip.Prefix{netip.PrefixFrom(v6, 128)}}))
	}},
	{name: "conflicting protocols", errno: unix.EINVAL, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(rule("unused", nft.MatchL4Proto{Proto: v1.ProtocolTCP}, nft.MatchDport{Proto: v1.ProtocolUDP, Port: 53}))
	}},

	{name: "comment nft cannot read", errno: unix.EINVAL, index: 1, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(&nft.Chain{Name: "c", Comment: "fine"})
		tx.Add(&nft.Rule{Chain: "c", Stmts: []nft.Stmt{nft.Counter{}}, Comment: `say "hi"`})
	}},
	{name: "comment too long", errno: unix.EINVAL, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(&nft.Element{Set: "ips", Key: []nft.Value{{Addr: svc2}}, Comment: strings.Repeat("x", nft.MaxCommentLen+1)})
	}},

	// Chains.
	{name: "delete a chain a rule jumps to, with rules of its own", errno: unix.EBUSY, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Delete(&nft.Chain{Name: "masq"})
	}},
	// The kernel deletes a chain's own rules with it.
	{name: "delete a chain with rules nothing jumps to", build: func(tx *nft.Transaction) {
		tx.Add(rule("unused", nft.Counter{}, nft.Verdict{Kind: nft.Accept}))
		tx.Delete(&nft.Chain{Name: "unused"})
	}},
	{name: "delete a chain a rule jumps to", errno: unix.EBUSY, index: 1, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(rule("unused", nft.Verdict{Kind: nft.Jump, Chain: "via-map"}))
		tx.Delete(&nft.Chain{Name: "via-map"})
	}},
	{name: "delete a chain a map element goes to", errno: unix.EBUSY, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Delete(&nft.Chain{Name: "via-map"})
	}},
	{name: "delete a chain numgen goes to", errno: unix.EBUSY, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Delete(&nft.Chain{Name: "ep"})
	}},
	{name: "flush then delete chains no longer used", build: func(tx *nft.Transaction) {
		tx.Delete(el("nodeports", []nft.Value{{Proto: v1.ProtocolTCP}, {Port: 30000}}, nil))
		tx.Delete(&nft.Chain{Name: "via-map"})
		tx.Flush(&nft.Chain{Name: "svc"})
		tx.Flush(&nft.Chain{Name: "ep"})
		tx.Delete(&nft.Chain{Name: "ep"})
		tx.Delete(&nft.Chain{Name: "unused"})
	}},
	{name: "delete a missing chain", errno: unix.ENOENT, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Delete(&nft.Chain{Name: "nope"})
	}},
	{name: "flush a missing chain", errno: unix.ENOENT, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Flush(&nft.Chain{Name: "nope"})
	}},
	{name: "base chain re-added with another hook", errno: unix.EOPNOTSUPP, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(&nft.Chain{Name: "filter-input", Type: nft.TypeFilter, Hook: nft.HookOutput, Priority: -110})
	}},
	{name: "base chain re-added with another priority", errno: unix.EOPNOTSUPP, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(&nft.Chain{Name: "filter-input", Type: nft.TypeFilter, Hook: nft.HookInput, Priority: 0})
	}},
	{name: "regular chain re-added as a base chain", errno: unix.EEXIST, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(&nft.Chain{Name: "unused", Type: nft.TypeFilter, Hook: nft.HookInput})
	}},
	{name: "base chain re-added as a regular chain, chains re-added with comments", build: func(tx *nft.Transaction) {
		tx.Add(&nft.Chain{Name: "filter-input"})
		tx.Add(&nft.Chain{Name: "svc", Comment: "another comment"})
		tx.Add(&nft.Chain{Name: "nat-prerouting", Type: nft.TypeNAT, Hook: nft.HookPrerouting, Priority: nft.PriorityDstNAT})
	}},

	// Sets.
	{name: "set re-added with another flag", errno: unix.EEXIST, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(&nft.Set{Name: "ips", Key: []nft.DataType{nft.TypeIPv4Addr}, Interval: true})
	}},
	{name: "set re-added with another key", errno: unix.EEXIST, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(&nft.Set{Name: "ips", Key: []nft.DataType{nft.TypeInetService}})
	}},
	{name: "set re-added as a map", errno: unix.EEXIST, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(&nft.Set{Name: "ips", Key: []nft.DataType{nft.TypeIPv4Addr}, Data: nft.TypeVerdict})
	}},
	{name: "sets re-added with another comment and timeout", build: func(tx *nft.Transaction) {
		tx.Add(&nft.Set{Name: "ips", Key: []nft.DataType{nft.TypeIPv4Addr}, Comment: "other"})
		tx.Add(&nft.Set{Name: "tmap", Key: []nft.DataType{nft.TypeIPv4Addr}, Data: nft.TypeVerdict, Timeout: 20 * time.Second})
	}},
	{name: "flush a map as a set", errno: unix.ENOENT, index: 1, checkIndex: true, build: func(tx *nft.Transaction) {
		// nft -f refuses this; netlink would not mind, but the adapter
		// refuses it when the transaction declares the map.
		tx.Add(&nft.Set{Name: "tmap", Key: []nft.DataType{nft.TypeIPv4Addr}, Data: nft.TypeVerdict, Timeout: 10 * time.Second})
		tx.Flush(&nft.Set{Name: "tmap"})
	}},
	{name: "delete a set a rule uses", errno: unix.EBUSY, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Delete(&nft.Set{Name: "ips"})
	}},
	{name: "delete a missing set", errno: unix.ENOENT, index: 0, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Delete(&nft.Set{Name: "nope"})
	}},
	{name: "flush and delete an unused set", build: func(tx *nft.Transaction) {
		tx.Flush(&nft.Set{Name: "tmap", Data: nft.TypeVerdict})
		tx.Delete(&nft.Set{Name: "tmap", Data: nft.TypeVerdict})
		tx.Flush(&nft.Set{Name: "ranges"})
	}},

	// Validation of what is reachable from base chains.
	{name: "masquerade reachable from prerouting", errno: unix.EOPNOTSUPP, build: func(tx *nft.Transaction) {
		tx.Add(rule("services", nft.Verdict{Kind: nft.Jump, Chain: "masq"}))
	}},
	{name: "dnat reachable from a filter chain", errno: unix.EOPNOTSUPP, build: func(tx *nft.Transaction) {
		tx.Add(rule("filter-input", nft.Verdict{Kind: nft.Jump, Chain: "ep"}))
	}},
	{name: "reject reachable from postrouting", errno: unix.EOPNOTSUPP, build: func(tx *nft.Transaction) {
		tx.Add(rule("masq", nft.Reject{}))
	}},
	{name: "reject in prerouting and input", build: func(tx *nft.Transaction) {
		tx.Add(rule("services", nft.Reject{}))
		tx.Add(rule("filter-input", nft.Reject{}))
	}},
	{name: "dnat reachable through a map element", errno: unix.EOPNOTSUPP, build: func(tx *nft.Transaction) {
		tx.Add(&nft.Set{Name: "fw", Key: []nft.DataType{nft.TypeIPv4Addr}, Data: nft.TypeVerdict})
		tx.Add(el("fw", []nft.Value{{Addr: svc1}}, gotoV("svc")))
		tx.Add(rule("filter-input", nft.VmapLookup{Fields: []nft.Field{nft.FieldDaddr}, Map: "fw"}))
	}},
	{name: "chain loop", errno: unix.EMLINK, build: func(tx *nft.Transaction) {
		tx.Add(&nft.Chain{Name: "loop"})
		tx.Add(rule("loop", nft.Verdict{Kind: nft.Jump, Chain: "services"}))
		tx.Add(rule("services", nft.Verdict{Kind: nft.Jump, Chain: "loop"}))
	}},
	{name: "loop not reachable from a base chain", build: func(tx *nft.Transaction) {
		tx.Add(&nft.Chain{Name: "loop"})
		tx.Add(rule("loop", nft.Verdict{Kind: nft.Jump, Chain: "unused"}))
		tx.Add(rule("unused", nft.Verdict{Kind: nft.Jump, Chain: "loop"}))
	}},

	// Tables.
	{name: "flush the table", build: func(tx *nft.Transaction) {
		tx.Flush(&nft.Table{})
		tx.Delete(&nft.Chain{Name: "unused"})
	}},
	{name: "delete and recreate the table", build: func(tx *nft.Transaction) {
		tx.Delete(&nft.Table{})
		tx.Add(&nft.Table{Comment: "new"})
		tx.Add(&nft.Chain{Name: "c"})
	}},
	{name: "operation after deleting the table", errno: unix.ENOENT, index: 1, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Delete(&nft.Table{})
		tx.Add(&nft.Chain{Name: "c"})
	}},

	// Several tables in one transaction (kproxy's shards): one kernel
	// transaction, objects resolved in their own table only.
	{name: "second table in the same transaction", build: func(tx *nft.Transaction) {
		t2 := tx.In(tbl + "-2")
		t2.Add(&nft.Table{})
		t2.Add(&nft.Chain{Name: "c2"})
		t2.Add(&nft.Chain{Name: "nat2", Type: nft.TypeNAT, Hook: nft.HookPrerouting, Priority: nft.PriorityDstNAT})
		t2.Add(&nft.Set{Name: "svcmap", Key: []nft.DataType{nft.TypeIPv4Addr}, Data: nft.TypeVerdict})
		t2.Add(el("svcmap", []nft.Value{{Addr: svc2}}, gotoV("c2")))
		tx.Add(el("ips", []nft.Value{{Addr: svc2}}, nil))
		t2.AddRules(rule("nat2", nft.VmapLookup{Fields: []nft.Field{nft.FieldDaddr}, Map: "svcmap"}))
		tx.Add(&nft.Chain{Name: "c2"})
	}},
	{name: "jump to a chain of another table", errno: unix.ENOENT, index: 2, checkIndex: true, build: func(tx *nft.Transaction) {
		t2 := tx.In(tbl + "-2")
		t2.Add(&nft.Table{})
		t2.Add(&nft.Chain{Name: "c3"})
		t2.AddRules(rule("c3", nft.Verdict{Kind: nft.Jump, Chain: "services"}))
	}},
	{name: "failure in another table undoes the whole transaction", errno: unix.ENOENT, index: 1, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(&nft.Chain{Name: "new"})
		tx.In("no-such-table").Add(&nft.Chain{Name: "c"})
	}},

	// Atomicity: a big transaction failing at its last operation.
	{name: "everything then a bad jump", errno: unix.ENOENT, index: 8, checkIndex: true, build: func(tx *nft.Transaction) {
		tx.Add(&nft.Chain{Name: "new"})
		tx.Add(rule("new", nft.Counter{}))
		tx.Flush(&nft.Chain{Name: "services"})
		tx.Add(el("ips", []nft.Value{{Addr: svc2}}, nil))
		tx.Delete(el("svcmap", svcKey(svc1, v1.ProtocolTCP, 80), nil))
		tx.Flush(&nft.Set{Name: "ranges"})
		tx.Add(&nft.Set{Name: "newset", Key: []nft.DataType{nft.TypeInetService}})
		tx.Add(&nft.Table{Comment: "changed?"})
		tx.Add(rule("new", nft.Verdict{Kind: nft.Goto, Chain: "nope"}))
	}},
}
