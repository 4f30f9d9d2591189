package nftables

import (
	"crypto/sha256"
	"encoding/base32"
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/model"
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
	// postrouting, which nft can only test through such a set.
	setHairpin               = "hairpin-endpoints"
	prefixServiceChain       = "service-"
	prefixExternalChain      = "external-"
	prefixLocalChain         = "local-"
	prefixFirewallChain      = "firewall-"
	prefixEndpointChain      = "endpoint-"
	prefixAffinitySet        = "affinity-"
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
	for _, p := range []string{prefixServiceChain, prefixExternalChain, prefixLocalChain, prefixFirewallChain, prefixEndpointChain, prefixAffinitySet} {
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
func portBase(n model.ServicePortName) string {
	return n.Namespace + "/" + n.Name + "/" + nft.ProtoName(n.Protocol) + "/" + n.Port
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

func newPortNames(n model.ServicePortName) portNames {
	base := portBase(n)
	return portNames{base: base, hash: hashOf(base)}
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
	return limit(prefixEndpointChain + hashOf(base) + "-" + base)
}

// affinitySetName includes the timeout in its hash: the kernel cannot change
// the timeout of an existing set, so a new timeout means a new set.
func affinitySetName(n model.ServicePortName, e *model.Endpoint, timeoutSeconds int32) string {
	base := endpointBase(n, e)
	return limit(prefixAffinitySet + hashOf(base+"/"+strconv.Itoa(int(timeoutSeconds))) + "-" + base)
}

// baseChains are declared as data: name, type, hook, priority, and the
// rules they always hold.
type baseChain struct {
	name, typ, hook string
	priority        int
}

var baseChains = []baseChain{
	{chainFilterPreroutingPreDNAT, nft.TypeFilter, nft.HookPrerouting, nft.PriorityDstNAT - 10},
	{chainFilterOutputPreDNAT, nft.TypeFilter, nft.HookOutput, nft.PriorityDstNAT - 10},
	{chainFilterForward, nft.TypeFilter, nft.HookForward, nft.PriorityFilter},
	{chainFilterInput, nft.TypeFilter, nft.HookInput, nft.PriorityFilter},
	{chainFilterOutput, nft.TypeFilter, nft.HookOutput, nft.PriorityFilter},
	{chainNATPrerouting, nft.TypeNAT, nft.HookPrerouting, nft.PriorityDstNAT},
	{chainNATOutput, nft.TypeNAT, nft.HookOutput, nft.PriorityDstNAT},
	{chainNATPostrouting, nft.TypeNAT, nft.HookPostrouting, nft.PrioritySrcNAT},
}
