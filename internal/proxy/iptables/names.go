package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/safetext"
)

// Tables kproxy writes.
const (
	tableFilter = "filter"
	tableNAT    = "nat"
	tableMangle = "mangle"
)

// Fixed chains, with upstream's names (pkg/proxy/iptables/proxier.go) so
// that `iptables-save | grep KUBE` and operators' scripts keep working.
const (
	chainServices         = "KUBE-SERVICES"          // nat: DNAT entry; filter: reject/drop services without endpoints
	chainExternalServices = "KUBE-EXTERNAL-SERVICES" // filter: external destinations without (local) endpoints
	chainNodePorts        = "KUBE-NODEPORTS"         // nat: node ports; filter: health check node ports
	chainPostrouting      = "KUBE-POSTROUTING"       // nat: masquerade marked packets
	chainMarkMasq         = "KUBE-MARK-MASQ"         // nat: mark for masquerade
	chainForward          = "KUBE-FORWARD"           // filter: accept forwarded service traffic
	chainProxyFirewall    = "KUBE-PROXY-FIREWALL"    // filter: loadBalancerSourceRanges drops
	chainCanary           = "KUBE-PROXY-CANARY"      // mangle, nat, filter: empty; its absence means someone flushed the tables
	// chainKubeletFirewall is the kubelet's anti-martian chain; upstream
	// ensures it and its jumps in both families, writes an identical copy
	// of the rule when localhost node ports are on (the rule that closes
	// CVE-2020-8558) and never deletes it.
	chainKubeletFirewall = "KUBE-FIREWALL"
	// chainIPTablesHint tells containerized tools (iptables-wrapper, CNI
	// plugins) which backend the node uses: its presence in the nft or
	// the legacy mangle table decides. Only the kubelet creates it;
	// kproxy, as upstream kube-proxy, leaves it alone.
	chainIPTablesHint = "KUBE-IPTABLES-HINT"
)

// nfacct counters the rules count in, with upstream's names
// (pkg/proxy/metrics), read by its metrics
// kubeproxy_iptables_ct_state_invalid_dropped_packets_total and
// kubeproxy_iptables_localhost_nodeports_accepted_packets_total. A node
// that ran upstream keeps its counts. nfacct objects belong to the network
// namespace, not to a family: both families' rules count in the same one.
const (
	NFAcctInvalidDropped     = "ct_state_invalid_dropped_pkts"
	NFAcctLocalhostNodePorts = "localhost_nps_accepted_pkts"
)

// Per-service chain prefixes. Each is followed by 16 characters of base32
// of a SHA-256: iptables chain names are at most 28 characters.
const (
	prefixSVC = "KUBE-SVC-" // cluster policy: endpoint choice
	prefixSVL = "KUBE-SVL-" // local policy: endpoint choice among local endpoints
	prefixEXT = "KUBE-EXT-" // external destinations: masquerade, short-circuit, then policy
	prefixFW  = "KUBE-FW-"  // loadBalancerSourceRanges
	prefixSEP = "KUBE-SEP-" // one endpoint: hairpin masquerade, affinity, DNAT
	// prefixXLB is the pre-1.24 name of KUBE-SVL-; kproxy never writes
	// it but removes it like its own when an old node still has one.
	prefixXLB = "KUBE-XLB-"
)

var ourPrefixes = []string{prefixFW, prefixEXT, prefixSVC, prefixSVL, prefixXLB, prefixSEP}

// isServiceChain reports whether a nat chain is a per-service or
// per-endpoint chain of kube-proxy's layout, and so ours to delete when no
// service uses it.
func isServiceChain(name string) bool {
	for _, p := range ourPrefixes {
		if strings.HasPrefix(name, p) && len(name) == len(p)+16 {
			return true
		}
	}
	return false
}

// chainRank orders chains so that a chain comes before every chain it may
// jump to (FW → EXT → SVC/SVL → SEP): deleting stale chains in this order
// never deletes a chain another stale chain still references, even when
// the deletions are spread over several restores.
func chainRank(name string) int {
	for i, p := range ourPrefixes {
		if strings.HasPrefix(name, p) {
			return i
		}
	}
	return len(ourPrefixes)
}

// portName is upstream's ServicePortName.String(): "ns/name" and ":port"
// when the port is named. It is hashed into chain names and written in
// comments.
func portName(n model.ServicePortName) string {
	s := n.Namespace + "/" + n.Name
	if n.Port != "" {
		s += ":" + n.Port
	}
	return s
}

// commentArg is the argument of --comment in iptables-restore input for
// a comment text: the text made safe by safetext.Comment (within
// xt_comment's 255 bytes, no quote, backslash, newline or other control
// character that would end the comment or the line and let an object's
// name write rules of its own), between double quotes when it holds a
// space. Upstream's comments come out as upstream writes them:
// "ns/name:port cluster IP" quoted, a bare ns/name:port not.
func commentArg(text string) string {
	text = safetext.Comment(text, safetext.IPTablesComment)
	if text == "" || strings.IndexByte(text, ' ') >= 0 {
		return `"` + text + `"`
	}
	return text
}

// protoLower is the protocol as iptables writes it ("tcp", "udp", "sctp").
func protoLower(p string) string { return strings.ToLower(p) }

func hash16(s string) string { return hashName("", s) }

// hashName is prefix followed by hash16(s), built in one allocation (a
// full sync names 110k chains at 10k services).
func hashName(prefix, s string) string {
	sum := sha256.Sum256([]byte(s))
	var enc [56]byte // base32 of 32 bytes
	base32.StdEncoding.Encode(enc[:], sum[:])
	var b [32]byte
	return string(append(append(b[:0], prefix...), enc[:16]...))
}

// serviceChains are the names of one service port's chains.
type serviceChains struct {
	name     string // portName
	proto    string // lower case
	svc, svl string
	ext, fw  string
}

func newServiceChains(n model.ServicePortName) serviceChains {
	name, proto := portName(n), protoLower(string(n.Protocol))
	h := hash16(name + proto)
	return serviceChains{
		name: name, proto: proto,
		svc: prefixSVC + h, svl: prefixSVL + h, ext: prefixEXT + h, fw: prefixFW + h,
	}
}

// endpointChain is KUBE-SEP-<hash of name, protocol and "ip:port">
// ("[ip]:port" for IPv6), as upstream names it.
func (c serviceChains) endpointChain(e *model.Endpoint) string {
	return hashName(prefixSEP, c.name+c.proto+e.String())
}

// probability is upstream's --probability value for the i-th of n
// endpoints: 1/(n-i), written with ten decimals, so that each of the n
// rules, tried in order, takes an equal share of new connections.
func probability(remaining int) string {
	return strconv.FormatFloat(1.0/float64(remaining), 'f', 10, 64)
}
