// Package view is what `kproxy render` shows. Load runs a snapshot (a
// file, or the built-in example) through the proxy's model for one node.
// Build turns the model into the view printed when render shows the model
// rather than rules: each service port, its addresses, the endpoints
// chosen for this node and why others were left out. rules.go prints the
// rules each mode would write on a fresh node, from every backend's
// NewOptions as the proxy takes them.
package view

import (
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"unicode/utf8"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/model"
)

// Snapshot is the whole view for one node.
type Snapshot struct {
	Node     string         `json:"node"`
	Zone     string         `json:"zone,omitempty"`
	Families []FamilyView   `json:"families"`
	Skipped  []SkippedEntry `json:"skipped,omitempty"`
}

// SkippedEntry is an object or part of one that was left out, and why.
type SkippedEntry struct {
	Object string `json:"object"`
	Reason string `json:"reason"`
}

// FamilyView is one IP family.
type FamilyView struct {
	Family   v1.IPFamily   `json:"family"`
	Services []ServiceView `json:"services"`
	// Contested lists the addresses a service port claims but another
	// one keeps (see model/resolve.go); the loser is skipped for them.
	Contested []ContestedView `json:"contested,omitempty"`
}

// ContestedView is one lost claim on an address.
type ContestedView struct {
	ServicePort string `json:"servicePort"`
	Claim       string `json:"claim"`
	Address     string `json:"address"`
	KeptBy      string `json:"keptBy"`
	KeptAs      string `json:"keptAs"`
}

// ServiceView is one service port.
type ServiceView struct {
	Name                     string         `json:"name"`
	Type                     v1.ServiceType `json:"type"`
	ClusterIP                string         `json:"clusterIP"`
	Port                     int32          `json:"port"`
	Protocol                 v1.Protocol    `json:"protocol"`
	NodePort                 int32          `json:"nodePort,omitempty"`
	ExternalIPs              []string       `json:"externalIPs,omitempty"`
	LoadBalancerVIPs         []string       `json:"loadBalancerVIPs,omitempty"`
	LoadBalancerProxyIPs     []string       `json:"loadBalancerProxyIPs,omitempty"`
	LoadBalancerSourceRanges []string       `json:"loadBalancerSourceRanges,omitempty"`
	LoadBalancerClosed       bool           `json:"loadBalancerClosed,omitempty"`
	SessionAffinitySeconds   int32          `json:"sessionAffinitySeconds,omitempty"`
	ExternalTrafficPolicy    string         `json:"externalTrafficPolicy,omitempty"`
	InternalTrafficPolicy    string         `json:"internalTrafficPolicy"`
	HealthCheckNodePort      int32          `json:"healthCheckNodePort,omitempty"`
	Topology                 string         `json:"topology,omitempty"`
	// Cluster / Local are the endpoints used for each traffic policy.
	Cluster  []string       `json:"clusterEndpoints,omitempty"`
	Local    []string       `json:"localEndpoints,omitempty"`
	Fallback string         `json:"fallback,omitempty"`
	Excluded []ExcludedView `json:"excluded,omitempty"`
	// Verdict says in one phrase what traffic meets.
	Verdict string `json:"verdict"`
}

// ExcludedView is an endpoint left out, and why.
type ExcludedView struct {
	Endpoint string `json:"endpoint"`
	Reason   string `json:"reason"`
}

// Build assembles the view of the given states for a node.
func Build(states []*model.State, node *model.Node, nodeName string) *Snapshot {
	s := &Snapshot{Node: nodeName, Zone: node.Zone()}
	for _, st := range states {
		fv := FamilyView{Family: st.Family}
		for _, n := range st.SortedNames() {
			fv.Services = append(fv.Services, service(st.Services[n], st.Endpoints[n], nodeName, node.Zone()))
		}
		for _, l := range st.Lost() {
			fv.Contested = append(fv.Contested, ContestedView{ServicePort: l.Loser.String(), Claim: l.LoserKind.String(),
				Address: l.Address, KeptBy: l.Winner.String(), KeptAs: l.WinnerKind.String()})
		}
		s.Families = append(s.Families, fv)
	}
	return s
}

func strs[T fmt.Stringer](xs []T) []string {
	var out []string
	for _, x := range xs {
		out = append(out, x.String())
	}
	return out
}

func service(sp *model.ServicePort, eps []*model.Endpoint, nodeName, zone string) ServiceView {
	sel := model.SelectEndpoints(sp, eps, nodeName, zone)
	v := ServiceView{
		Name:                     sp.Name.String(),
		Type:                     sp.Type,
		ClusterIP:                sp.ClusterIP.String(),
		Port:                     sp.Port,
		Protocol:                 sp.Protocol,
		NodePort:                 sp.NodePort,
		ExternalIPs:              strs(sp.ExternalIPs),
		LoadBalancerVIPs:         strs(sp.LoadBalancerVIPs()),
		LoadBalancerSourceRanges: strs(sp.LoadBalancerSourceRanges),
		LoadBalancerClosed:       sp.LoadBalancerClosed,
		SessionAffinitySeconds:   sp.StickyMaxAgeSeconds,
		InternalTrafficPolicy:    "Cluster",
		HealthCheckNodePort:      sp.HealthCheckNodePort,
		Topology:                 sel.Topology,
		Cluster:                  strs(sel.Cluster),
		Local:                    strs(sel.Local),
	}
	for _, in := range sp.LoadBalancerIngress {
		if in.Proxy {
			v.LoadBalancerProxyIPs = append(v.LoadBalancerProxyIPs, in.IP.String())
		}
	}
	if sp.ExternallyAccessible() {
		v.ExternalTrafficPolicy = "Cluster"
		if sp.ExternalPolicyLocal {
			v.ExternalTrafficPolicy = "Local"
		}
	}
	if sp.InternalPolicyLocal {
		v.InternalTrafficPolicy = "Local"
	}
	switch {
	case sel.ClusterFallback && sel.LocalFallback:
		v.Fallback = "no ready endpoints: using serving terminating ones"
	case sel.ClusterFallback:
		v.Fallback = "no ready endpoints: cluster traffic uses serving terminating ones"
	case sel.LocalFallback:
		v.Fallback = "no ready local endpoints: local traffic uses serving terminating ones"
	}
	for _, e := range eps {
		if why, ok := sel.Excluded[e]; ok {
			v.Excluded = append(v.Excluded, ExcludedView{Endpoint: e.String(), Reason: why})
		}
	}
	v.Verdict = verdict(sp, sel)
	return v
}

func verdict(sp *model.ServicePort, sel model.Selection) string {
	switch {
	case !sel.HasAny:
		return "reject: no endpoints"
	case sp.InternalPolicyLocal && len(sel.Local) == 0:
		return "drop internal traffic: no local endpoints"
	case sp.ExternalPolicyLocal && len(sel.Local) == 0:
		return "drop external traffic: no local endpoints"
	}
	return fmt.Sprintf("load-balance over %d endpoint(s)", len(sel.AllReachable))
}

// WriteTable prints the view as aligned text for humans, narrow enough for
// a terminal: each service port's first address (with how many more it
// has) and its verdict, then the endpoints left out and why. WriteWideTable
// prints every address, the traffic policies and the endpoints chosen.
func WriteTable(w io.Writer, s *Snapshot) error { return writeTable(w, s, false) }

// WriteWideTable is WriteTable with every column, as `-o wide` asks.
func WriteWideTable(w io.Writer, s *Snapshot) error { return writeTable(w, s, true) }

func writeTable(w io.Writer, s *Snapshot, wide bool) error {
	b := &strings.Builder{}
	fmt.Fprintf(b, "# node %s", s.Node)
	if s.Zone != "" {
		fmt.Fprintf(b, " (zone %s)", s.Zone)
	}
	fmt.Fprintln(b)
	for _, f := range s.Families {
		fmt.Fprintf(b, "\n## %s\n", f.Family)
		t := table{header: []string{"SERVICE PORT", "TYPE", "ADDRESSES", "VERDICT"}}
		if wide {
			t.header = []string{"SERVICE PORT", "TYPE", "ADDRESSES", "POLICY", "ENDPOINTS FOR THIS NODE", "VERDICT"}
		}
		for _, sv := range f.Services {
			addrs := addresses(sv)
			r := row{cells: []string{sv.Name, string(sv.Type), abbreviate(addrs), sv.Verdict}}
			if wide {
				r.cells = []string{sv.Name, string(sv.Type), strings.Join(addrs, " "), policy(sv), endpoints(sv), sv.Verdict}
			}
			for _, ex := range sv.Excluded {
				r.notes = append(r.notes, fmt.Sprintf("- %s left out: %s", ex.Endpoint, ex.Reason))
			}
			if sv.Fallback != "" {
				r.notes = append(r.notes, "! "+sv.Fallback)
			}
			t.rows = append(t.rows, r)
		}
		t.write(b)
		for _, c := range f.Contested {
			fmt.Fprintf(b, "! contested: %s\n", c)
		}
	}
	if len(s.Skipped) > 0 {
		fmt.Fprintln(b, "\n## skipped")
		t := table{}
		for _, sk := range s.Skipped {
			t.rows = append(t.rows, row{cells: []string{sk.Object, sk.Reason}})
		}
		t.write(b)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// table aligns its cells in columns two spaces apart. A row's notes are
// printed under it, indented, and take no part in the columns' widths, so
// a long reason does not widen the table.
type table struct {
	header []string
	rows   []row
}

type row struct {
	cells []string
	notes []string
}

func (t table) write(b *strings.Builder) {
	lines := t.rows
	if t.header != nil {
		lines = append([]row{{cells: t.header}}, t.rows...)
	}
	var width []int
	for _, r := range lines {
		for i, c := range r.cells {
			if i == len(width) {
				width = append(width, 0)
			}
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	for _, r := range lines {
		for i, c := range r.cells {
			if i == len(r.cells)-1 {
				b.WriteString(c)
				break
			}
			b.WriteString(c)
			b.WriteString(strings.Repeat(" ", width[i]-utf8.RuneCountInString(c)+2))
		}
		b.WriteString("\n")
		for _, n := range r.notes {
			b.WriteString("    " + n + "\n")
		}
	}
}

// abbreviate shows the first of a service port's addresses and how many
// others it has, as kubectl shortens an endpoint list.
func abbreviate(addrs []string) string {
	if len(addrs) <= 1 {
		return strings.Join(addrs, "")
	}
	return fmt.Sprintf("%s +%d more", addrs[0], len(addrs)-1)
}

// String says what the loser is skipped for.
func (c ContestedView) String() string {
	what := "skipped for this address"
	switch c.Claim {
	case model.ClaimClusterIP.String():
		what = "not programmed in this family"
	case model.ClaimNodePort.String():
		what = "no node port"
	}
	return fmt.Sprintf("%s claims %s as %s, kept by %s as %s: %s", c.ServicePort, c.Address, c.Claim, c.KeptBy, c.KeptAs, what)
}

func hostPort(ip string, port int32) string {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return ip
	}
	return netip.AddrPortFrom(a, uint16(port)).String()
}

// addresses lists what a service port answers on and what shapes it, the
// cluster IP first.
func addresses(sv ServiceView) []string {
	parts := []string{hostPort(sv.ClusterIP, sv.Port) + "/" + strings.ToLower(string(sv.Protocol))}
	if sv.NodePort != 0 {
		parts = append(parts, fmt.Sprintf("nodePort %d", sv.NodePort))
	}
	for _, ip := range sv.ExternalIPs {
		parts = append(parts, "ext "+ip)
	}
	for _, ip := range sv.LoadBalancerVIPs {
		parts = append(parts, "lb "+ip)
	}
	for _, ip := range sv.LoadBalancerProxyIPs {
		parts = append(parts, "lb "+ip+" (ipMode Proxy: not captured)")
	}
	if len(sv.LoadBalancerSourceRanges) > 0 {
		parts = append(parts, "from "+strings.Join(sv.LoadBalancerSourceRanges, ","))
	}
	if sv.LoadBalancerClosed {
		parts = append(parts, "lb closed (source ranges of the other family only)")
	}
	if sv.HealthCheckNodePort != 0 {
		parts = append(parts, fmt.Sprintf("health %d", sv.HealthCheckNodePort))
	}
	return parts
}

func policy(sv ServiceView) string {
	p := "int=" + sv.InternalTrafficPolicy
	if sv.ExternalTrafficPolicy != "" {
		p += " ext=" + sv.ExternalTrafficPolicy
	}
	if sv.SessionAffinitySeconds > 0 {
		p += fmt.Sprintf(" affinity=%ds", sv.SessionAffinitySeconds)
	}
	if sv.Topology != "" {
		p += " topology=" + sv.Topology
	}
	return p
}

func endpoints(sv ServiceView) string {
	var parts []string
	if len(sv.Cluster) > 0 {
		parts = append(parts, "cluster: "+strings.Join(sv.Cluster, ","))
	}
	if len(sv.Local) > 0 && !slices.Equal(sv.Local, sv.Cluster) {
		parts = append(parts, "local: "+strings.Join(sv.Local, ","))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, "; ")
}
