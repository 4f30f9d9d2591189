package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/proxy/nftables"
	"github.com/kproxy/kproxy/internal/trace"
	nfttrace "github.com/kproxy/kproxy/internal/trace/nftables"
	"github.com/kproxy/kproxy/test/e2e/framework"
)

// modeCase is a proxy mode (and backend) every scenario runs in, as a
// subtest named after it. Adding a mode is adding an entry to modes: the
// scenarios check traffic, which is the same in every mode, and read the
// rules only through these functions.
type modeCase struct {
	// name is the subtest's name, e.g. "nftables", "iptables-legacy".
	name string
	// proxyMode is kproxy's --proxy-mode and what /proxyMode answers.
	proxyMode string
	// env is extra environment for kproxy (e.g. IPTABLES_MODE=legacy).
	env []string
	// args are extra kproxy flags.
	args []string
	// minSyncFlag is the flag that sets the mode's minimum sync interval
	// (--iptables-min-sync-period feeds the nftables mode too, as
	// upstream's does).
	minSyncFlag string
	// captured lists what the node's rules capture, both IP families,
	// sorted, one string per service address ("198.19.0.10 . tcp . 80")
	// and per NodePort ("nodeport tcp . 30080" per family). Scenarios
	// compare it across changes and outages.
	captured func(ns string) ([]string, error)
	// identity is something that changes when kproxy deletes and
	// recreates its rules instead of updating them in place (nftables:
	// the tables' handles). nil when the mode has nothing such.
	identity func(ns string) (string, error)
	// trace, when the mode has a tracer, walks pkt through the node's
	// live rules and returns the endpoints it may be DNATed to.
	trace func(ns string, pkt trace.Packet, local []netip.Addr) ([]netip.AddrPort, error)
}

// modes are the proxy modes that have landed. iptables-legacy and
// iptables-nft are appended here when they do.
var modes = []modeCase{nftablesMode}

var nftablesMode = modeCase{
	name:        "nftables",
	proxyMode:   "nftables",
	minSyncFlag: "--iptables-min-sync-period",
	captured:    nftCaptured,
	identity:    nftIdentity,
	trace:       nftTrace,
}

// nftFamilies are the table families kproxy uses in nftables mode.
var nftFamilies = []string{"ip", "ip6"}

func nft(ns string, args ...string) (string, error) {
	return framework.RunIn(context.Background(), ns, "nft", args...)
}

// nftTable is one of kproxy's tables: the main table of a family, or one
// of its shard tables (kube-proxy-sN, holding the dispatch of a share of
// the services).
type nftTable struct {
	Family, Name string
	Handle       int
}

// nftTables lists kproxy's tables in the namespace, sorted.
func nftTables(ns string) ([]nftTable, error) {
	text, err := nft(ns, "-j", "list", "tables")
	if err != nil {
		return nil, err
	}
	var doc struct {
		Nftables []struct {
			Table *nftTable `json:"table"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(text), &doc); err != nil {
		return nil, fmt.Errorf("parsing nft -j list tables: %w", err)
	}
	var out []nftTable
	for _, o := range doc.Nftables {
		if o.Table != nil && slices.Contains(nftFamilies, o.Table.Family) &&
			len(nftables.OurTables(nftables.DefaultTableName, []string{o.Table.Name})) == 1 {
			out = append(out, *o.Table)
		}
	}
	slices.SortFunc(out, func(a, b nftTable) int {
		return strings.Compare(a.Family+" "+a.Name, b.Family+" "+b.Name)
	})
	return out, nil
}

// nftCaptured reads the service-ips, cluster-services (plain ClusterIP
// ports, which have no element in service-ips) and service-nodeports maps
// of every table of kproxy's. (cluster-services-new only repeats keys of
// cluster-services, with newer verdicts.)
func nftCaptured(ns string) ([]string, error) {
	text, err := nft(ns, "-j", "list", "maps")
	if err != nil {
		return nil, err
	}
	maps, err := parseMaps(text)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range maps {
		if len(nftables.OurTables(nftables.DefaultTableName, []string{m.Table})) == 0 {
			continue
		}
		switch m.Name {
		case "service-ips", "cluster-services":
			out = append(out, m.Keys...)
		case "service-nodeports":
			for _, k := range m.Keys {
				out = append(out, m.Family+" nodeport "+k)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// nftIdentity is the handle of each of kproxy's tables: the kernel gives a
// re-created table a new one.
func nftIdentity(ns string) (string, error) {
	tables, err := nftTables(ns)
	if err != nil {
		return "", err
	}
	var ids []string
	for _, fam := range nftFamilies {
		main := slices.IndexFunc(tables, func(t nftTable) bool { return t.Family == fam && t.Name == nftables.DefaultTableName })
		if main < 0 {
			return "", fmt.Errorf("no table %s %s", fam, nftables.DefaultTableName)
		}
	}
	for _, t := range tables {
		ids = append(ids, fmt.Sprintf("%s/%s#%d", t.Family, t.Name, t.Handle))
	}
	return strings.Join(ids, " "), nil
}

// nftTrace walks pkt through kproxy's tables as `nft list table` shows
// them (the main table holds the filter side, the shards the dispatch).
func nftTrace(ns string, pkt trace.Packet, local []netip.Addr) ([]netip.AddrPort, error) {
	tables, err := nftTables(ns)
	if err != nil {
		return nil, err
	}
	var text strings.Builder
	for _, t := range tables {
		out, err := nft(ns, "list", "table", t.Family, t.Name)
		if err != nil {
			return nil, err
		}
		text.WriteString(out)
	}
	rs, err := nfttrace.ParseNFT(text.String())
	if err != nil {
		return nil, fmt.Errorf("parsing the live ruleset: %w", err)
	}
	res, err := rs.Trace(pkt, trace.Host{LocalAddrs: local})
	if err != nil {
		return nil, err
	}
	return res.Endpoints(), nil
}

// serviceKey is how captured names a service address.
func serviceKey(ip string, proto corev1.Protocol, port int32) string {
	return fmt.Sprintf("%s . %s . %d", ip, strings.ToLower(string(proto)), port)
}

// nodePortKey is how captured names a NodePort of a family ("ip", "ip6").
func nodePortKey(fam string, proto corev1.Protocol, port int32) string {
	return fmt.Sprintf("%s nodeport %s . %d", fam, strings.ToLower(string(proto)), port)
}
