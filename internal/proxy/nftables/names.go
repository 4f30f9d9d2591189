package nftables

import (
	"crypto/sha256"
	"encoding/base32"
	"net/netip"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/safetext"
)

// DefaultTableName is upstream's table name in both families, so a node that
// moves from upstream kube-proxy to kproxy takes its table over.
const DefaultTableName = "kube-proxy"

// Fixed chains. Base chains run at upstream's priorities since v1.34 (and
// v1.33.5, kubernetes#132456): the firewall check at dstnat-10, before DNAT
// rewrites the destination, because source ranges apply to the LB IP; the
// endpoint checks (reject or drop for services without usable endpoints)
// at filter priority 0, after DNAT, so that traffic the node short-circuits
// to cluster endpoints (node or pod to an externalTrafficPolicy: Local
// address without local endpoints) is not dropped.
const (
	chainFilterPreroutingPreDNAT = "filter-prerouting-pre-dnat"
	chainFilterOutputPreDNAT     = "filter-output-pre-dnat"
	chainFilterInput             = "filter-input"
	chainFilterForward           = "filter-forward"
	chainFilterOutput            = "filter-output"
	chainNATPrerouting           = "nat-prerouting"
	chainNATOutput               = "nat-output"
	chainNATPostrouting          = "nat-postrouting"

	chainServices               = "services"
	chainMasquerading           = "masquerading"
	chainMarkForMasquerade      = "mark-for-masquerade"
	chainClusterIPsCheck        = "cluster-ips-check"
	chainFirewallCheck          = "firewall-check"
	chainServiceEndpointsCheck  = "service-endpoints-check"
	chainNodePortEndpointsCheck = "nodeport-endpoints-check"
	chainReject                 = "reject-chain"
)

// Sets and maps.
const (
	setClusterIPs          = "cluster-ips"
	setNodePortIPs         = "nodeport-ips"
	mapServiceIPs          = "service-ips"
	mapServiceNodePorts    = "service-nodeports"
	mapNoEndpointServices  = "no-endpoint-services"
	mapNoEndpointNodePorts = "no-endpoint-nodeports"
	mapFirewallIPs         = "firewall-ips"
	// setHairpin holds "ep . ep" for every endpoint address: a packet DNATed
	// back to the pod that sent it has source == destination in
	// postrouting, which nft can only test through such a set. Each shard
	// table holds the pairs of the addresses hairpinShard gives it.
	setHairpin = "hairpin-endpoints"
	// mapClusterServices sends the packets of plain ClusterIP service
	// ports (see plainService) to the chain of their protocol and
	// endpoint count; the "-new" and "-newer" maps (clusterServicesMap),
	// looked up first, hold those partial syncs changed until a clean-up
	// folds them into the first (see plainApplied). All are in every
	// shard table, with the endpoint maps of each protocol
	// (clusterEndpointsMap).
	mapClusterServices  = "cluster-services"
	prefixServiceChain  = "service-"
	prefixExternalChain = "external-"
	prefixLocalChain    = "local-"
	prefixFirewallChain = "firewall-"
	prefixEndpointChain = "endpoint-"
	prefixAffinitySet   = "affinity-"
	// prefixEndpointMap names the endpoint maps of a shard,
	// "endpoints-tcp/7": one per protocol and group of service ports
	// (see endpointGroups). The "/" makes isOurs recognize them.
	prefixEndpointMap = "endpoints-"
	// prefixSharedChain names the chains plain ClusterIP services share,
	// one per protocol and endpoint count: "cluster/tcp/3" (see
	// sharedChainName). The "/" makes isOurs recognize them.
	prefixSharedChain        = "cluster/"
	maxNameLength            = 255 // NFT_NAME_MAXLEN - 1 for the NUL
	tableComment             = "rules for kube-proxy"
	clusterIPsComment        = "Active ClusterIPs"
	nodePortIPsComment       = "IPs that accept NodePort traffic"
	serviceIPsComment        = "ClusterIP, ExternalIP and LoadBalancer IP traffic"
	serviceNodePortsComment  = "NodePort traffic"
	noEndpointServicesComent = "vmap to drop or reject packets to services with no endpoints"
	noEndpointNodePortsComnt = "vmap to drop or reject packets to service nodeports with no endpoints"
	firewallIPsComment       = "destinations that are subject to LoadBalancerSourceRanges"
	hairpinComment           = "endpoint . endpoint: traffic a service sent back to its source"
	clusterServicesComment   = "ClusterIP traffic of services without a chain of their own"
)

// isOurs reports whether a chain or set name is one of the per-service
// objects kproxy creates, and so may be removed when no longer used.
// Per-service names always carry "ns/name/proto/port"; fixed names never
// contain "/" but do share prefixes with them ("service-ips",
// "firewall-check"), so the prefix alone would schedule them for deletion.
func isOurs(name string) bool {
	if !strings.Contains(name, "/") {
		return false
	}
	for _, p := range []string{prefixServiceChain, prefixExternalChain, prefixLocalChain, prefixFirewallChain, prefixEndpointChain, prefixAffinitySet, prefixEndpointMap, prefixSharedChain} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// hashOf is a short stable hash that makes names unique even after
// truncation and regardless of characters that names cannot carry.
func hashOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	// Eight base32 characters are exactly the first five bytes (base32
	// encodes 5-byte groups on their own), so only those are encoded.
	var out [8]byte
	base32.StdEncoding.Encode(out[:], sum[:5])
	return string(out[:])
}

// portBase is "ns/name/proto/port", as upstream writes it in chain names.
// Names hash it as is; what they show of it is safetext.Name(portBase).
func portBase(n model.ServicePortName) string {
	return n.Namespace + "/" + n.Name + "/" + nft.ProtoName(n.Protocol) + "/" + n.Port
}

// portComment is the comment of a service port's elements: upstream's
// "ns/name:port/PROTO", cut to what nft accepts and without characters
// nft cannot read back (see safetext.Comment).
func portComment(n model.ServicePortName) string {
	return safetext.Comment(n.String(), safetext.NFTComment)
}

func limit(s string) string {
	if len(s) > maxNameLength {
		return s[:maxNameLength]
	}
	return s
}

func serviceChainName(prefix string, n model.ServicePortName) string {
	return newPortNames(n).chain(prefix)
}

// portNames holds what every per-service chain name of one service port
// shares, so that the hash is computed once for its (up to four) chains.
type portNames struct{ base, hash string }

// The hash is of the name as the object has it, the readable part only
// what nft can read unquoted: names that differ only in characters
// safetext.Name replaces, or past the cut, stay apart.
func newPortNames(n model.ServicePortName) portNames {
	base := portBase(n)
	return portNames{base: safetext.Name(base), hash: hashOf(base)}
}

func (p portNames) chain(prefix string) string {
	return limit(prefix + p.hash + "-" + p.base)
}

// endpointBase is "ns/name/proto/port__IP/PORT"; nft names cannot carry ':'
// unquoted, so IPv6 colons become dots.
func endpointBase(n model.ServicePortName, e *model.Endpoint) string {
	ip := strings.ReplaceAll(e.IP.String(), ":", ".")
	return portBase(n) + "__" + ip + "/" + strconv.Itoa(int(e.Port))
}

// endpointChainName is how upstream names its per-endpoint chains. kproxy
// writes none, but removes them (as stale) when it takes over a table
// written by upstream; tests use the name to build such tables.
func endpointChainName(n model.ServicePortName, e *model.Endpoint) string {
	base := endpointBase(n, e)
	return limit(prefixEndpointChain + hashOf(base) + "-" + safetext.Name(base))
}

// affinitySetName includes the timeout in its hash: the kernel cannot change
// the timeout of an existing set, so a new timeout means a new set.
func affinitySetName(n model.ServicePortName, e *model.Endpoint, timeoutSeconds int32) string {
	base := endpointBase(n, e)
	return limit(prefixAffinitySet + hashOf(base+"/"+strconv.Itoa(int(timeoutSeconds))) + "-" + safetext.Name(base))
}

// baseChains are declared as data: name, type, hook, priority, and the
// rules they always hold. mainBaseChains are those of the main table (the
// filter side, and masquerading in postrouting); shardBaseChains those of
// every shard table: the per-service dispatch at dstnat, and the hairpin
// mark in postrouting just before the main table masquerades (a nat
// chain that sets no binding leaves the later ones of its hook to run).
type baseChain struct {
	name, typ, hook string
	priority        int
}

var mainBaseChains = []baseChain{
	{chainFilterPreroutingPreDNAT, nft.TypeFilter, nft.HookPrerouting, nft.PriorityDstNAT - 10},
	{chainFilterOutputPreDNAT, nft.TypeFilter, nft.HookOutput, nft.PriorityDstNAT - 10},
	{chainFilterForward, nft.TypeFilter, nft.HookForward, nft.PriorityFilter},
	{chainFilterInput, nft.TypeFilter, nft.HookInput, nft.PriorityFilter},
	{chainFilterOutput, nft.TypeFilter, nft.HookOutput, nft.PriorityFilter},
	{chainNATPostrouting, nft.TypeNAT, nft.HookPostrouting, nft.PrioritySrcNAT},
}

var shardBaseChains = []baseChain{
	{chainNATPrerouting, nft.TypeNAT, nft.HookPrerouting, nft.PriorityDstNAT},
	{chainNATOutput, nft.TypeNAT, nft.HookOutput, nft.PriorityDstNAT},
	{chainNATPostrouting, nft.TypeNAT, nft.HookPostrouting, nft.PrioritySrcNAT - 1},
}

// Shards. Services are spread over several tables, "TABLE-s0" ...
// "TABLE-s<K-1>", each holding the dispatch of its services: the
// service-ips and service-nodeports verdict maps, the per-service chains
// and affinity sets, and nat-prerouting/nat-output base chains that look
// the packet up in its own maps; and a share of the hairpin pairs
// (hairpinShard) with a nat-postrouting chain that marks them. The main
// table keeps what does not grow with the endpoints (filter-side checks,
// masquerading, the cluster IPs), so that re-creating it is cheap (a
// repair, repair.go: the hairpin pairs, one per endpoint address, were
// 65k of its 75k elements at 10k services × 10 endpoints).
//
// Why: the kernel validates, on every commit that adds a jump, a goto
// element or a NAT rule, every chain reachable from the base chains of
// each table the commit touched (nft_table_validate). With all services
// in one table a one-endpoint change cost O(cluster) in the kernel (~3 µs
// per service); with shards it costs O(one shard). A new connection pays
// one map lookup per shard: the nat base chains of every shard run on the
// hook until one of them DNATs (the nat core skips later nat chains of a
// hook once a binding is set up).
//
// The shard of a service port is a stable hash of "ns/name/proto/port"
// modulo the shard count K, a power of two. K is chosen at full syncs
// only, from the number of service ports, with hysteresis (see
// chooseShards); between full syncs new services go to their hash modulo
// the current K.
const (
	shardSuffix = "-s"
	// DefaultServicesPerShard is the shard size K is chosen for: the
	// kernel's validation walk costs about 3 µs per service port of a
	// shard per commit, so ~0.5-1k services keep it at 1-3 ms, while the
	// number of nat base chains a new connection passes stays small (16
	// at dstnat and 16 in postrouting at 10k services, 64 each at 50k).
	DefaultServicesPerShard = 1024
	shardComment            = "rules for kube-proxy: one shard of the services"
)

// ShardTable is the name of shard i of a main table.
func ShardTable(main string, i int) string {
	return main + shardSuffix + strconv.Itoa(i)
}

// ShardIndex reports whether table is a shard table of main ("MAIN-sN",
// N a decimal number without leading zeros) and its index.
func ShardIndex(main, table string) (int, bool) {
	rest, ok := strings.CutPrefix(table, main+shardSuffix)
	if !ok || rest == "" || len(rest) > 6 || (len(rest) > 1 && rest[0] == '0') {
		return 0, false
	}
	i, err := strconv.Atoi(rest)
	if err != nil || i < 0 || strconv.Itoa(i) != rest {
		return 0, false
	}
	return i, true
}

// OurTables picks, from the tables of a family, the main table and its
// shard tables: what kproxy writes, traces and cleans up.
func OurTables(main string, tables []string) []string {
	var out []string
	for _, t := range tables {
		if _, ok := ShardIndex(main, t); ok || t == main {
			out = append(out, t)
		}
	}
	return out
}

// shardHash is the stable hash a service port's shard derives from
// (FNV-1a of "ns/name/proto/port"): it must not change between versions,
// or an upgrade would move every service at its first full sync.
func shardHash(n model.ServicePortName) uint32 {
	h := uint32(2166136261)
	for _, part := range []string{n.Namespace, "/", n.Name, "/", nft.ProtoName(n.Protocol), "/", n.Port} {
		for i := 0; i < len(part); i++ {
			h ^= uint32(part[i])
			h *= 16777619
		}
	}
	return h
}

// endpointGroups is the number of endpoint maps per protocol and shard.
// A shard holds ~256-2048 service ports (see chooseShards), so a map is
// shared by ~8-64 of them: few sets per table (the kernel looks a set up
// by name, linearly) and few rules per map (adding an element to a map
// checks it against every rule bound to the map, and binding a map walks
// its elements, so one map per shard would make a full sync quadratic
// again).
const endpointGroups = 32

// endpointMapName is the endpoint map of a service port's group: bits of
// the shard hash above those the shard index uses (at most 2^16 shards).
func endpointMapName(n model.ServicePortName) string {
	return prefixEndpointMap + nft.ProtoName(n.Protocol) + "/" + strconv.Itoa(int(shardHash(n)>>16)%endpointGroups)
}

// endpointMapProto is the protocol of an endpoint map name, "" if name
// is not one.
func endpointMapProto(name string) v1.Protocol {
	rest, ok := strings.CutPrefix(name, prefixEndpointMap)
	if !ok {
		return ""
	}
	p, _, ok := strings.Cut(rest, "/")
	if !ok {
		return ""
	}
	for _, proto := range []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP} {
		if nft.ProtoName(proto) == p {
			return proto
		}
	}
	return ""
}

// hairpinShard is the shard among k (a power of two) whose table holds
// the hairpin pair of address ip: by address, not by service, so that an
// address several services share is one element, and the pairs spread
// evenly. A packet's pair is in one shard; every shard's nat-postrouting
// chain looks in its own set. FNV-1a of the address bytes, stable across
// versions like shardHash.
func hairpinShard(ip netip.Addr, k int) int {
	if k <= 1 {
		return 0
	}
	a16 := ip.As16()
	b := a16[:]
	if ip.Is4() {
		b = b[12:]
	}
	h := uint32(2166136261)
	for _, c := range b {
		h ^= uint32(c)
		h *= 16777619
	}
	return int(h & uint32(k-1))
}

// ShardOf is the shard of a service port among k (a power of two).
func ShardOf(n model.ServicePortName, k int) int {
	if k <= 1 {
		return 0
	}
	return int(shardHash(n) & uint32(k-1))
}

// chooseShards returns the shard count for n service ports: the current
// count cur while the average shard holds between perShard/4 and
// 2*perShard service ports (hysteresis: a cluster hovering around a
// boundary does not move its services at every full sync), else the
// smallest power of two that keeps shards at most perShard.
func chooseShards(n, cur, perShard int) int {
	if perShard <= 0 {
		perShard = DefaultServicesPerShard
	}
	if cur > 0 && n <= 2*perShard*cur && (cur == 1 || 4*n >= perShard*cur) {
		return cur
	}
	k := 1
	for k*perShard < n && k < 1<<16 {
		k *= 2
	}
	return k
}

// plainProtocols are the protocols plain service ports may have: each
// shard table has the endpoint maps of every one.
var plainProtocols = []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP}

// plainTiers is the number of versions of a plain port's elements the
// kernel may hold at once (see plainApplied): tier 0 in cluster-services
// and cluster-endpoints-PROTO, tiers 1 and 2 in the "-new" and "-newer"
// maps, the higher looked up first.
const plainTiers = 3

var tierSuffix = [plainTiers]string{"", "-new", "-newer"}

// clusterServicesMap is the verdict map of a tier.
func clusterServicesMap(tier int) string { return mapClusterServices + tierSuffix[tier] }

// clusterEndpointsMap is the endpoint map (CLUSTER-IP . PORT . INDEX :
// ENDPOINT . PORT) of plain service ports of a protocol and a tier:
// cluster-endpoints-tcp, cluster-endpoints-new-tcp, ...
func clusterEndpointsMap(p v1.Protocol, tier int) string {
	return "cluster-endpoints" + tierSuffix[tier] + "-" + nft.ProtoName(p)
}

// sharedChainName is the chain shared by the plain service ports of a
// protocol with n endpoints.
func sharedChainName(p v1.Protocol, n int) string {
	return prefixSharedChain + nft.ProtoName(p) + "/" + strconv.Itoa(n)
}
