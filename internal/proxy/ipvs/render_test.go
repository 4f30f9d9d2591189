package ipvs

// Feature tests of Render. Many are upstream's own cases
// (pkg/proxy/ipvs/proxier_test.go, v1.37) with this project's address
// plan: node-a 198.18.0.10 (fd00:18::10), its pods 198.18.129.0/24, the
// other node's pods 198.18.130.0/24, cluster IPs 198.19.0.0/16, external
// and LB IPs 198.19.200.0/24, clients 203.0.113.0/24.

import (
	"context"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/kernel/xtables/xtablestest"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/localdetect"
	"github.com/kproxy/kproxy/internal/testutil/fixtures"
)

var nodeA = &model.Node{
	Name:      example.NodeA,
	Addresses: []netip.Addr{netip.MustParseAddr("198.18.0.10"), netip.MustParseAddr("fd00:18::10")},
	PodCIDRs:  []netip.Prefix{netip.MustParsePrefix("198.18.129.0/24"), netip.MustParsePrefix("fd00:18:1:a::/64")},
}

// hostAddrs are node-a's addresses: a second NIC's, loopback and an IPv6
// link-local one (the last two never carry node ports).
var hostAddrs = addrs("198.18.0.10", "198.18.1.10", "127.0.0.1", "fd00:18::10", "fe80::1", "::1")

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func testConfig(f v1.IPFamily) *Config {
	c := exampleConfig(f)
	c.LocalDetect.Mode = localdetect.ClusterCIDR
	return c
}

type svcEps struct {
	sp  *model.ServicePort
	eps []*model.Endpoint
}

func stateOf(f v1.IPFamily, list ...svcEps) *model.State {
	s := model.NewState(f)
	for _, x := range list {
		s.Services[x.sp.Name] = x.sp
		s.Endpoints[x.sp.Name] = x.eps
	}
	return s
}

func render(t *testing.T, cfg *Config, list ...svcEps) *Plan {
	t.Helper()
	d, err := Render(cfg, stateOf(cfg.Family, list...), nodeA, Host{Addrs: hostAddrs})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// services lists the virtual servers as "proto addr:port" with their real
// servers and, when set, flags and timeout.
func services(d *Plan) map[string][]string {
	out := map[string][]string{}
	for _, vs := range d.Sorted() {
		k := serviceArg(vs.VirtualServer)
		reals := []string{}
		for _, r := range vs.Reals {
			if r.Weight != 1 {
				reals = append(reals, "weight!=1")
			}
			reals = append(reals, netip.AddrPortFrom(r.Addr, r.Port).String())
		}
		if vs.Flags != 0 || vs.Timeout != 0 {
			k += " flags=" + fmtUint(vs.Flags) + " timeout=" + fmtUint(vs.Timeout)
		}
		if vs.Scheduler != "rr" {
			k += " " + vs.Scheduler
		}
		out[k] = reals
	}
	return out
}

func fmtUint(v uint32) string { return strconv.FormatUint(uint64(v), 10) }

// entries returns the non-empty sets' members by name.
func entries(d *Plan) map[string][]string {
	out := map[string][]string{}
	for n, s := range d.Sets {
		if len(s.Entries) > 0 {
			out[n] = s.Entries
		}
	}
	return out
}

// chainRules returns the rules of one chain of one table in the restore
// input, without the "-A CHAIN " prefix.
func chainRules(d *Plan, table, chain string) []string {
	var out []string
	in := ""
	for _, l := range strings.Split(string(d.IPTables), "\n") {
		if strings.HasPrefix(l, "*") {
			in = l[1:]
			continue
		}
		if in == table && strings.HasPrefix(l, "-A "+chain+" ") {
			out = append(out, strings.TrimPrefix(l, "-A "+chain+" "))
		}
	}
	return out
}

func TestRenderRefusesBadConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"scheduler", func(c *Config) { c.Scheduler = "roundrobin" }, `unknown scheduler "roundrobin"`},
		{"family", func(c *Config) { c.Family = "IPv5" }, "unknown IP family"},
		{"mark", func(c *Config) { c.MasqueradeBit = 32 }, "masqueradeBit 32"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig(model.IPv4)
			tc.edit(c)
			_, err := Render(c, model.NewState(model.IPv4), nodeA, Host{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	// A state of the other family is refused, not half rendered.
	if _, err := Render(testConfig(model.IPv4), model.NewState(model.IPv6), nodeA, Host{}); err == nil {
		t.Fatal("an IPv6 state rendered for IPv4 was accepted")
	}
}

// Upstream's TestIPv4Proxier / TestMultiPortServiceBindAddr: a cluster IP
// with two ports is one address on kube-ipvs0 and two virtual servers; a
// service without endpoints still has its virtual server.
func TestClusterIP(t *testing.T) {
	p80 := fixtures.ServicePort("web", "198.19.0.10", 80, nil)
	p443 := fixtures.ServicePort("web", "198.19.0.10", 443, func(sp *model.ServicePort) { sp.Name.Port = "p443" })
	udp := fixtures.ServicePort("dns", "198.19.0.11", 53, func(sp *model.ServicePort) { sp.Protocol = model.UDP })
	empty := fixtures.ServicePort("empty", "198.19.0.12", 80, nil)
	eps := []*model.Endpoint{fixtures.Endpoint("198.18.129.10", 8080, true, nil), fixtures.Endpoint("198.18.130.10", 8080, false, nil)}
	d := render(t, testConfig(model.IPv4),
		svcEps{p80, eps}, svcEps{p443, eps},
		svcEps{udp, []*model.Endpoint{fixtures.Endpoint("198.18.130.53", 53, false, nil)}},
		svcEps{empty, nil})

	want := map[string][]string{
		"-t 198.19.0.10:80":  {"198.18.129.10:8080", "198.18.130.10:8080"},
		"-t 198.19.0.10:443": {"198.18.129.10:8080", "198.18.130.10:8080"},
		"-u 198.19.0.11:53":  {"198.18.130.53:53"},
		"-t 198.19.0.12:80":  {},
	}
	if diff := cmp.Diff(want, services(d)); diff != "" {
		t.Errorf("virtual servers (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(addrs("198.19.0.10", "198.19.0.11", "198.19.0.12"), d.Addresses, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("kube-ipvs0 addresses (-want +got):\n%s", diff)
	}
	wantSets := map[string][]string{
		SetClusterIP: {"198.19.0.10,tcp:443", "198.19.0.10,tcp:80", "198.19.0.11,udp:53", "198.19.0.12,tcp:80"},
		// Only the local endpoint can hairpin through this node.
		SetLoopBack: {"198.18.129.10,tcp:8080,198.18.129.10"},
		SetIPVSIPs:  {"198.19.0.10", "198.19.0.11", "198.19.0.12"},
	}
	if diff := cmp.Diff(wantSets, entries(d)); diff != "" {
		t.Errorf("set members (-want +got):\n%s", diff)
	}
	// Every set exists, empty or not, as upstream creates them all.
	if len(d.Sets) != len(setInfo) {
		t.Errorf("%d sets, want %d", len(d.Sets), len(setInfo))
	}
	// Upstream's TestDismissLocalhostRuleExist and TestAcceptIPVSTraffic.
	svc := chainRules(d, TableNAT, ChainServices)
	if len(svc) == 0 || svc[0] != "-s 127.0.0.0/8 -j RETURN" {
		t.Errorf("KUBE-SERVICES does not start by letting localhost alone: %q", svc)
	}
	if last := svc[len(svc)-1]; last != "-m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT" {
		t.Errorf("KUBE-SERVICES ends with %q, want the cluster IP ACCEPT (no LB set members)", last)
	}
}

// Masquerade of cluster IP traffic per masqueradeAll and detectLocalMode.
func TestClusterIPMasquerade(t *testing.T) {
	sp := fixtures.ServicePort("web", "198.19.0.10", 80, nil)
	const match = `-m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP `
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"cluster CIDR", nil, match + "dst,dst ! -s 198.18.128.0/17 -j KUBE-MARK-MASQ"},
		{"masqueradeAll", func(c *Config) { c.MasqueradeAll = true }, match + "dst,dst -j KUBE-MARK-MASQ"},
		{"node CIDR", func(c *Config) { c.LocalDetect.Mode = localdetect.NodeCIDR }, match + "dst,dst ! -s 198.18.129.0/24 -j KUBE-MARK-MASQ"},
		{"interface prefix", func(c *Config) {
			c.LocalDetect = localdetect.Config{Mode: localdetect.InterfaceNamePrefix, InterfaceNamePrefix: "veth"}
		}, match + "dst,dst ! -i veth+ -j KUBE-MARK-MASQ"},
		// Nothing tells pods apart: the node's own connections from a
		// service address are masqueraded.
		{"no detector", func(c *Config) { c.LocalDetect.ClusterCIDRs = nil }, match + "src,dst -j KUBE-MARK-MASQ"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig(model.IPv4)
			if tc.edit != nil {
				tc.edit(c)
			}
			d := render(t, c, svcEps{sp, nil})
			if !slices.Contains(chainRules(d, TableNAT, ChainServices), tc.want) {
				t.Errorf("KUBE-SERVICES lacks %q:\n%s", tc.want, d.IPTables)
			}
		})
	}
}

// Upstream's TestNodePortIPv4: a virtual server per node port address
// (not loopback), bitmap sets for TCP and UDP, one hash entry per address
// for SCTP; nodePortAddresses narrows the addresses.
func TestNodePorts(t *testing.T) {
	np := func(name, ip string, proto v1.Protocol, port int32) *model.ServicePort {
		return fixtures.ServicePort(name, ip, 80, func(sp *model.ServicePort) {
			sp.Type, sp.Protocol, sp.NodePort = v1.ServiceTypeNodePort, proto, port
		})
	}
	ep := []*model.Endpoint{fixtures.Endpoint("198.18.130.10", 8080, false, nil)}
	list := []svcEps{{np("a", "198.19.0.10", model.TCP, 30080), ep}, {np("b", "198.19.0.11", model.UDP, 30053), ep}, {np("c", "198.19.0.12", model.SCTP, 30099), ep}}

	d := render(t, testConfig(model.IPv4), list...)
	got := services(d)
	for _, k := range []string{"-t 198.18.0.10:30080", "-t 198.18.1.10:30080", "-u 198.18.0.10:30053", "-u 198.18.1.10:30053", "--sctp-service 198.18.0.10:30099", "--sctp-service 198.18.1.10:30099"} {
		if diff := cmp.Diff([]string{"198.18.130.10:8080"}, got[k]); diff != "" {
			t.Errorf("%s (-want +got):\n%s", k, diff)
		}
	}
	for k := range got {
		if strings.Contains(k, "127.0.0.1") {
			t.Errorf("node port on loopback: %s", k)
		}
	}
	if len(got) != 9 {
		t.Errorf("%d virtual servers, want 3 cluster IPs + 6 node ports: %v", len(got), got)
	}
	e := entries(d)
	want := map[string][]string{
		SetNodePortTCP:  {"30080"},
		SetNodePortUDP:  {"30053"},
		SetNodePortSCTP: {"198.18.0.10,sctp:30099", "198.18.1.10,sctp:30099"},
	}
	for s, w := range want {
		if diff := cmp.Diff(w, e[s]); diff != "" {
			t.Errorf("%s (-want +got):\n%s", s, diff)
		}
	}
	// Node IPs are never put on kube-ipvs0.
	if slices.Contains(d.Addresses, netip.MustParseAddr("198.18.0.10")) {
		t.Error("a node IP is on kube-ipvs0")
	}
	if diff := cmp.Diff([]string{
		`-p tcp -m comment --comment "Kubernetes nodeport TCP port for masquerade purpose" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ`,
		`-p udp -m comment --comment "Kubernetes nodeport UDP port for masquerade purpose" -m set --match-set KUBE-NODE-PORT-UDP dst -j KUBE-MARK-MASQ`,
		`-p sctp -m comment --comment "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'" -m set --match-set KUBE-NODE-PORT-SCTP-HASH dst,dst -j KUBE-MARK-MASQ`,
	}, chainRules(d, TableNAT, ChainNodePort)); diff != "" {
		t.Errorf("nat KUBE-NODE-PORT (-want +got):\n%s", diff)
	}

	// nodePortAddresses: one CIDR selects one address.
	c := testConfig(model.IPv4)
	c.NodePortAddresses = []string{"198.18.1.0/24"}
	got = services(render(t, c, list...))
	if _, ok := got["-t 198.18.1.10:30080"]; !ok {
		t.Errorf("no node port on the selected address: %v", got)
	}
	if _, ok := got["-t 198.18.0.10:30080"]; ok {
		t.Errorf("node port on an address nodePortAddresses leaves out: %v", got)
	}
	// "primary" is the node's InternalIP.
	c.NodePortAddresses = []string{"primary"}
	got = services(render(t, c, list...))
	if _, ok := got["-t 198.18.0.10:30080"]; !ok || len(got) != 6 {
		t.Errorf("primary: want node ports on 198.18.0.10 only: %v", got)
	}
	// Loopback only: no node port at all (never on loopback in ipvs mode),
	// and no set member that would mark traffic for a virtual server that
	// is not there.
	c.NodePortAddresses = []string{"127.0.0.0/8"}
	d = render(t, c, list...)
	if len(services(d)) != 3 || len(entries(d)[SetNodePortTCP]) != 0 {
		t.Errorf("loopback-only nodePortAddresses: %v %v", services(d), entries(d))
	}
}

// Upstream's TestOnlyLocalNodePorts and TestOnlyLocalExternalIPs,
// TestOnlyLocalLoadBalancing: externalTrafficPolicy Local sends external
// traffic to local endpoints only, keeps the source (RETURN before the
// masquerade), and the cluster IP still uses every endpoint.
func TestExternalPolicyLocal(t *testing.T) {
	sp := fixtures.ServicePort("etp", "198.19.0.14", 80, func(sp *model.ServicePort) {
		sp.Type = v1.ServiceTypeLoadBalancer
		sp.NodePort = 30081
		sp.ExternalIPs = addrs("198.19.200.4")
		sp.LoadBalancerIngress = []model.LoadBalancerIngress{{IP: netip.MustParseAddr("198.19.200.3")}}
		sp.ExternalPolicyLocal = true
		sp.HealthCheckNodePort = 32081
	})
	eps := []*model.Endpoint{fixtures.Endpoint("198.18.129.20", 8080, true, nil), fixtures.Endpoint("198.18.130.20", 8080, false, nil)}
	d := render(t, testConfig(model.IPv4), svcEps{sp, eps})
	local, all := []string{"198.18.129.20:8080"}, []string{"198.18.129.20:8080", "198.18.130.20:8080"}
	want := map[string][]string{
		"-t 198.19.0.14:80":    all,
		"-t 198.19.200.4:80":   local,
		"-t 198.19.200.3:80":   local,
		"-t 198.18.0.10:30081": local,
		"-t 198.18.1.10:30081": local,
	}
	if diff := cmp.Diff(want, services(d)); diff != "" {
		t.Errorf("virtual servers (-want +got):\n%s", diff)
	}
	wantSets := map[string][]string{
		SetClusterIP:           {"198.19.0.14,tcp:80"},
		SetExternalIPLocal:     {"198.19.200.4,tcp:80"},
		SetLoadBalancer:        {"198.19.200.3,tcp:80"},
		SetLoadBalancerLocal:   {"198.19.200.3,tcp:80"},
		SetNodePortTCP:         {"30081"},
		SetNodePortLocalTCP:    {"30081"},
		SetHealthCheckNodePort: {"32081"},
		SetLoopBack:            {"198.18.129.20,tcp:8080,198.18.129.20"},
		SetIPVSIPs:             {"198.19.0.14", "198.19.200.3", "198.19.200.4"},
	}
	if diff := cmp.Diff(wantSets, entries(d)); diff != "" {
		t.Errorf("set members (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{
		`-p tcp -m comment --comment "Kubernetes nodeport TCP port with externalTrafficPolicy=local" -m set --match-set KUBE-NODE-PORT-LOCAL-TCP dst -j RETURN`,
		`-p tcp -m comment --comment "Kubernetes nodeport TCP port for masquerade purpose" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ`,
	}, chainRules(d, TableNAT, ChainNodePort)); diff != "" {
		t.Errorf("nat KUBE-NODE-PORT (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{
		`-m comment --comment "Kubernetes service load balancer ip + port with externalTrafficPolicy=local" -m set --match-set KUBE-LOAD-BALANCER-LOCAL dst,dst -j RETURN`,
		`-j KUBE-MARK-MASQ`,
	}, chainRules(d, TableNAT, ChainLoadBalancer)); diff != "" {
		t.Errorf("nat KUBE-LOAD-BALANCER (-want +got):\n%s", diff)
	}
	// External IPs of policy Local are accepted but not masqueraded.
	for _, r := range chainRules(d, TableNAT, ChainServices) {
		if strings.Contains(r, "KUBE-EXTERNAL-IP-LOCAL") && strings.HasSuffix(r, "KUBE-MARK-MASQ") {
			t.Errorf("policy Local external IP masqueraded: %s", r)
		}
	}
	// Upstream's TestHealthCheckNodePort: the health check port is let
	// in and not refused by KUBE-IPVS-FILTER.
	if !slices.Contains(chainRules(d, TableFilter, ChainNodePort), `-m comment --comment "Kubernetes health check node port" -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j ACCEPT`) {
		t.Errorf("filter KUBE-NODE-PORT lacks the health check ACCEPT:\n%s", d.IPTables)
	}

	// What the health check node port server is told (upstream's
	// SyncServices and SyncEndpoints): the port, one local endpoint.
	etp := sp.Name.NamespacedName
	if p, n := d.Health.HealthCheckPorts[etp], d.Health.LocalEndpoints[etp]; p != 32081 || n != 1 || d.Health.NoLocalEndpoints["external"] != 0 {
		t.Errorf("health: port %d, %d local endpoints, %v without local endpoints; want 32081, 1, none", p, n, d.Health.NoLocalEndpoints)
	}

	// No local endpoint: upstream falls back to every endpoint (traffic
	// from local pods keeps working), for external destinations only.
	d = render(t, testConfig(model.IPv4), svcEps{sp, eps[1:]})
	if diff := cmp.Diff([]string{"198.18.130.20:8080"}, services(d)["-t 198.18.0.10:30081"]); diff != "" {
		t.Errorf("node port without local endpoints (-want +got):\n%s", diff)
	}
	if p, n := d.Health.HealthCheckPorts[etp], d.Health.LocalEndpoints[etp]; p != 32081 || n != 0 || d.Health.NoLocalEndpoints["external"] != 1 {
		t.Errorf("health without local endpoints: port %d, %d local endpoints, %v without local endpoints; want 32081, 0, 1 external", p, n, d.Health.NoLocalEndpoints)
	}
}

// Upstream's TestExternalIPs and TestExternalIPsNoEndpoint: cluster
// policy external IPs are masqueraded; one that is a node address is not
// put on kube-ipvs0; a family's other external IPs are not its business.
func TestExternalIPs(t *testing.T) {
	sp := fixtures.ServicePort("ext", "198.19.0.13", 8080, func(sp *model.ServicePort) {
		sp.ExternalIPs = addrs("198.19.200.10", "198.18.1.10")
	})
	d := render(t, testConfig(model.IPv4), svcEps{sp, nil})
	want := map[string][]string{"-t 198.19.0.13:8080": {}, "-t 198.19.200.10:8080": {}, "-t 198.18.1.10:8080": {}}
	if diff := cmp.Diff(want, services(d)); diff != "" {
		t.Errorf("virtual servers (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"198.18.1.10,tcp:8080", "198.19.200.10,tcp:8080"}, entries(d)[SetExternalIP]); diff != "" {
		t.Errorf("KUBE-EXTERNAL-IP (-want +got):\n%s", diff)
	}
	if slices.Contains(d.Addresses, netip.MustParseAddr("198.18.1.10")) || !slices.Contains(d.Addresses, netip.MustParseAddr("198.19.200.10")) {
		t.Errorf("kube-ipvs0 addresses: %v (want the external IP, not the node's own)", d.Addresses)
	}
	const m = `-m comment --comment "Kubernetes service external ip + port for masquerade and filter purpose" -m set --match-set KUBE-EXTERNAL-IP dst,dst `
	svc := chainRules(d, TableNAT, ChainServices)
	for _, r := range []string{m + "-j KUBE-MARK-MASQ", m + "-m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT", m + "-m addrtype --dst-type LOCAL -j ACCEPT"} {
		if !slices.Contains(svc, r) {
			t.Errorf("KUBE-SERVICES lacks %q", r)
		}
	}
}

// Upstream's TestLoadBalancerSourceRanges, and the node's own access
// (kubernetes#119656): a range that holds the node's IP lets the LB IP
// itself in as a source; one that does not makes KUBE-IPVS-OUT-FILTER
// drop the node's connections to the LB IP.
func TestLoadBalancerSourceRanges(t *testing.T) {
	lb := func(ranges ...string) *model.ServicePort {
		return fixtures.ServicePort("lb", "198.19.0.12", 443, func(sp *model.ServicePort) {
			sp.Type = v1.ServiceTypeLoadBalancer
			sp.LoadBalancerIngress = []model.LoadBalancerIngress{{IP: netip.MustParseAddr("198.19.200.1")}}
			for _, r := range ranges {
				sp.LoadBalancerSourceRanges = append(sp.LoadBalancerSourceRanges, netip.MustParsePrefix(r))
			}
		})
	}
	ep := []*model.Endpoint{fixtures.Endpoint("198.18.130.10", 8080, false, nil)}

	d := render(t, testConfig(model.IPv4), svcEps{lb("203.0.113.0/24"), ep})
	want := map[string][]string{
		SetClusterIP:              {"198.19.0.12,tcp:443"},
		SetLoadBalancer:           {"198.19.200.1,tcp:443"},
		SetLoadBalancerFW:         {"198.19.200.1,tcp:443"},
		SetLoadBalancerSourceCIDR: {"198.19.200.1,tcp:443,203.0.113.0/24"},
		SetIPVSIPs:                {"198.19.0.12", "198.19.200.1"},
	}
	if diff := cmp.Diff(want, entries(d)); diff != "" {
		t.Errorf("set members (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{
		`-m comment --comment "Kubernetes service load balancer ip + port + source cidr for packet filter purpose" -m set --match-set KUBE-LOAD-BALANCER-SOURCE-CIDR dst,dst,src -j RETURN`,
		`-j DROP`,
	}, chainRules(d, TableFilter, ChainSourceRangesFirewall)); diff != "" {
		t.Errorf("KUBE-SOURCE-RANGES-FIREWALL (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{`-s 198.19.200.1 -m ipvs --vaddr 198.19.200.1 --vproto tcp --vport 443 -j DROP`}, chainRules(d, TableFilter, ChainIPVSOutFilter)); diff != "" {
		t.Errorf("KUBE-IPVS-OUT-FILTER (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"198.18.130.10:8080"}, services(d)["-t 198.19.200.1:443"]); diff != "" {
		t.Errorf("LB virtual server (-want +got):\n%s", diff)
	}

	// The node's own network in the ranges.
	d = render(t, testConfig(model.IPv4), svcEps{lb("203.0.113.0/24", "198.18.0.0/24"), ep})
	if diff := cmp.Diff([]string{"198.19.200.1,tcp:443,198.19.200.1"}, entries(d)[SetLoadBalancerSourceIP]); diff != "" {
		t.Errorf("KUBE-LOAD-BALANCER-SOURCE-IP (-want +got):\n%s", diff)
	}
	if r := chainRules(d, TableFilter, ChainIPVSOutFilter); len(r) != 0 {
		t.Errorf("node inside the ranges is kept out: %q", r)
	}

	// Ranges only of the other family: closed in this one (the project's
	// choice, see model.ServicePort.LoadBalancerClosed).
	closed := lb()
	closed.LoadBalancerClosed = true
	d = render(t, testConfig(model.IPv4), svcEps{closed, ep})
	if e := entries(d); len(e[SetLoadBalancerFW]) != 1 || len(e[SetLoadBalancerSourceCIDR]) != 0 {
		t.Errorf("closed LB: %v", e)
	}

	// Upstream's TestLoadBalancerIngressRouteTypeProxy: an ipMode Proxy
	// ingress IP is the load balancer's, not the node's.
	proxy := lb()
	proxy.LoadBalancerIngress[0].Proxy = true
	d = render(t, testConfig(model.IPv4), svcEps{proxy, ep})
	if _, ok := services(d)["-t 198.19.200.1:443"]; ok || len(entries(d)[SetLoadBalancer]) != 0 {
		t.Errorf("ipMode Proxy ingress IP got a virtual server or set member: %v", entries(d))
	}
}

// Upstream's TestSessionAffinity and the mh scheduler's flag.
func TestAffinityAndScheduler(t *testing.T) {
	sp := fixtures.ServicePort("aff", "198.19.0.16", 80, func(sp *model.ServicePort) {
		sp.StickyMaxAgeSeconds = 600
		sp.Type, sp.NodePort = v1.ServiceTypeNodePort, 30016
	})
	c := testConfig(model.IPv4)
	c.NodePortAddresses = []string{"primary"}
	got := services(render(t, c, svcEps{sp, nil}))
	for _, k := range []string{"-t 198.19.0.16:80 flags=1 timeout=600", "-t 198.18.0.10:30016 flags=1 timeout=600"} {
		if _, ok := got[k]; !ok {
			t.Errorf("no persistent virtual server %q: %v", k, got)
		}
	}
	c.Scheduler = "mh"
	got = services(render(t, c, svcEps{sp, nil}))
	if _, ok := got["-t 198.19.0.16:80 flags=17 timeout=600 mh"]; !ok {
		t.Errorf("mh: want persistent + source hash flags: %v", got)
	}
	c.Scheduler = "wlc"
	sp.StickyMaxAgeSeconds = 0
	got = services(render(t, c, svcEps{sp, nil}))
	if _, ok := got["-t 198.19.0.16:80 wlc"]; !ok {
		t.Errorf("wlc: %v", got)
	}
}

// Upstream's TestTestInternalTrafficPolicyE2E and the terminating
// endpoint cases (Test_EndpointSlice*ReadyAndTerminating*).
func TestEndpointSelection(t *testing.T) {
	terminating := func(serving bool) func(*model.Endpoint) {
		return func(e *model.Endpoint) { e.Ready, e.Serving, e.Terminating = false, serving, true }
	}
	for _, tc := range []struct {
		name  string
		local bool // internalTrafficPolicy Local
		eps   []*model.Endpoint
		want  []string
	}{
		{"cluster", false, []*model.Endpoint{fixtures.Endpoint("198.18.129.30", 80, true, nil), fixtures.Endpoint("198.18.130.30", 80, false, nil)}, []string{"198.18.129.30:80", "198.18.130.30:80"}},
		{"internal local", true, []*model.Endpoint{fixtures.Endpoint("198.18.129.30", 80, true, nil), fixtures.Endpoint("198.18.130.30", 80, false, nil)}, []string{"198.18.129.30:80"}},
		{"internal local, none local", true, []*model.Endpoint{fixtures.Endpoint("198.18.130.30", 80, false, nil)}, []string{}},
		{"ready beat terminating", false, []*model.Endpoint{fixtures.Endpoint("198.18.129.30", 80, true, terminating(true)), fixtures.Endpoint("198.18.130.30", 80, false, nil)}, []string{"198.18.130.30:80"}},
		{"only terminating: serving ones", false, []*model.Endpoint{fixtures.Endpoint("198.18.129.30", 80, true, terminating(true)), fixtures.Endpoint("198.18.130.30", 80, false, terminating(false))}, []string{"198.18.129.30:80"}},
		{"local only terminating", true, []*model.Endpoint{fixtures.Endpoint("198.18.129.30", 80, true, terminating(true)), fixtures.Endpoint("198.18.130.30", 80, false, nil)}, []string{"198.18.129.30:80"}},
		{"not ready", false, []*model.Endpoint{fixtures.Endpoint("198.18.130.30", 80, false, func(e *model.Endpoint) { e.Ready, e.Serving = false, false })}, []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp := fixtures.ServicePort("itp", "198.19.0.15", 80, func(sp *model.ServicePort) { sp.InternalPolicyLocal = tc.local })
			if diff := cmp.Diff(tc.want, services(render(t, testConfig(model.IPv4), svcEps{sp, tc.eps}))["-t 198.19.0.15:80"]); diff != "" {
				t.Errorf("real servers (-want +got):\n%s", diff)
			}
		})
	}
	// Topology: hints for zone-a keep the real servers in zone-a.
	hint := func(zone string) func(*model.Endpoint) {
		return func(e *model.Endpoint) { e.ZoneHints = sets.New(zone); e.Zone = zone }
	}
	node := *nodeA
	node.Labels = map[string]string{v1.LabelTopologyZone: "zone-a"}
	sp := fixtures.ServicePort("topo", "198.19.0.22", 80, nil)
	st := stateOf(model.IPv4, svcEps{sp, []*model.Endpoint{fixtures.Endpoint("198.18.129.80", 80, true, hint("zone-a")), fixtures.Endpoint("198.18.130.80", 80, false, hint("zone-b"))}})
	d, err := Render(testConfig(model.IPv4), st, &node, Host{Addrs: hostAddrs})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"198.18.129.80:80"}, services(d)["-t 198.19.0.22:80"]); diff != "" {
		t.Errorf("topology (-want +got):\n%s", diff)
	}
}

// Upstream's TestIPv6Proxier: IPv6 set names ("KUBE-6-", cut to 31
// characters), inet6 hash sets, ::1 left alone, AF_INET6 virtual servers.
func TestIPv6(t *testing.T) {
	sp := fixtures.ServicePort("v6", "fd00:19::17", 80, func(sp *model.ServicePort) {
		sp.Type = v1.ServiceTypeLoadBalancer
		sp.NodePort = 30017
		sp.LoadBalancerIngress = []model.LoadBalancerIngress{{IP: netip.MustParseAddr("fd00:19::c8:1")}}
		sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")}
	})
	d := render(t, testConfig(model.IPv6), svcEps{sp, []*model.Endpoint{fixtures.Endpoint("fd00:18:1:a::50", 8080, true, nil)}})
	want := map[string][]string{
		"-t [fd00:19::17]:80":    {"[fd00:18:1:a::50]:8080"},
		"-t [fd00:19::c8:1]:80":  {"[fd00:18:1:a::50]:8080"},
		"-t [fd00:18::10]:30017": {"[fd00:18:1:a::50]:8080"},
	}
	if diff := cmp.Diff(want, services(d)); diff != "" {
		t.Errorf("virtual servers (-want +got):\n%s", diff)
	}
	for _, vs := range d.Services {
		if vs.Family != 10 {
			t.Errorf("%v: family %d, want AF_INET6", vs.VirtualServer, vs.Family)
		}
	}
	wantSets := map[string][]string{
		"KUBE-6-CLUSTER-IP":               {"fd00:19::17,tcp:80"},
		"KUBE-6-LOAD-BALANCER":            {"fd00:19::c8:1,tcp:80"},
		"KUBE-6-LOAD-BALANCER-FW":         {"fd00:19::c8:1,tcp:80"},
		"KUBE-6-LOAD-BALANCER-SOURCE-CID": {"fd00:19::c8:1,tcp:80,2001:db8::/32"},
		"KUBE-6-NODE-PORT-TCP":            {"30017"},
		"KUBE-6-LOOP-BACK":                {"fd00:18:1:a::50,tcp:8080,fd00:18:1:a::50"},
		"KUBE-6-IPVS-IPS":                 {"fd00:19::17", "fd00:19::c8:1"},
	}
	if diff := cmp.Diff(wantSets, entries(d)); diff != "" {
		t.Errorf("set members (-want +got):\n%s", diff)
	}
	for n, s := range d.Sets {
		if len(n) > 31 || !strings.HasPrefix(n, "KUBE-6-") {
			t.Errorf("set name %q", n)
		}
		if s.IPv6 != (s.Type != "bitmap:port") {
			t.Errorf("set %s (%s): IPv6 %v", n, s.Type, s.IPv6)
		}
	}
	if r := chainRules(d, TableNAT, ChainServices); len(r) == 0 || r[0] != "-s ::1/128 -j RETURN" {
		t.Errorf("KUBE-SERVICES starts with %q", r)
	}
	if strings.Contains(string(d.IPTables), "--match-set KUBE-CLUSTER-IP ") {
		t.Error("IPv6 rules name an IPv4 set")
	}
}

// The restore input is something iptables-restore takes, its jump rules
// go in once: a second sync that sees them in the kernel does not insert
// them again.
func TestJumpRulesOnce(t *testing.T) {
	sp := fixtures.ServicePort("web", "198.19.0.10", 80, nil)
	fake := xtablestest.NewFake(xtables.NFT, xtables.IPv4)
	present := func() map[string]sets.Set[string] {
		out := map[string]sets.Set[string]{}
		for table, chains := range map[string][]string{TableNAT: {"PREROUTING", "OUTPUT", "POSTROUTING"}, TableFilter: {"INPUT", "FORWARD", "OUTPUT"}} {
			out[table] = sets.New[string]()
			for _, c := range chains {
				out[table].Insert(fake.Rules(table, c)...)
			}
		}
		return out
	}
	for i := range 2 {
		var rules map[string]sets.Set[string]
		if i > 0 {
			rules = present()
		}
		d, err := Render(testConfig(model.IPv4), stateOf(model.IPv4, svcEps{sp, nil}), nodeA, Host{Addrs: hostAddrs, Rules: rules})
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(d.IPTables), "\n-I "); (i == 0) != (n == len(JumpRules)) || (i > 0 && n != 0) {
			t.Errorf("sync %d inserts %d jump rules", i, n)
		}
		if err := fake.Restore(context.Background(), d.IPTables, xtables.RestoreOptions{NoFlush: true}); err != nil {
			t.Fatalf("sync %d: the fake refuses the input: %v\n%s", i, err, d.IPTables)
		}
	}
	got := present()
	for _, j := range JumpRules {
		n := 0
		for _, c := range []string{j.Chain} {
			for _, r := range fake.Rules(j.Table, c) {
				if r == j.Line {
					n++
				}
			}
		}
		if n != 1 {
			t.Errorf("%s %s: %d copies of %q", j.Table, j.Chain, n, j.Line)
		}
		if !got[j.Table].Has(j.Line) {
			t.Errorf("missing %q", j.Line)
		}
	}
	// Upstream's order: the last one prepended comes first.
	if r := fake.Rules(TableFilter, "INPUT"); len(r) != 3 || !strings.HasSuffix(r[0], "KUBE-IPVS-FILTER") || !strings.HasSuffix(r[2], "KUBE-NODE-PORT") {
		t.Errorf("filter INPUT: %q", r)
	}
}

// Upstream's TestNodePortIPv6 with policy Local for each protocol: the
// local sets of UDP and SCTP, and the health check node port that stays in
// its set when no address carries node ports (upstream skips it then).
func TestNodePortsLocalPerProtocol(t *testing.T) {
	mk := func(name, ip string, proto v1.Protocol, port int32) svcEps {
		return svcEps{fixtures.ServicePort(name, ip, 80, func(sp *model.ServicePort) {
			sp.Type, sp.Protocol, sp.NodePort = v1.ServiceTypeNodePort, proto, port
			sp.ExternalPolicyLocal, sp.HealthCheckNodePort = true, port+2000
		}), []*model.Endpoint{fixtures.Endpoint("fd00:18:1:a::20", 8080, true, nil)}}
	}
	list := []svcEps{mk("u", "fd00:19::1", model.UDP, 30053), mk("s", "fd00:19::2", model.SCTP, 30099)}
	c := testConfig(model.IPv6)
	d := render(t, c, list...)
	e := entries(d)
	want := map[string][]string{
		"KUBE-6-NODE-PORT-UDP":            {"30053"},
		"KUBE-6-NODE-PORT-LOCAL-UDP":      {"30053"},
		"KUBE-6-NODE-PORT-SCTP-HASH":      {"fd00:18::10,sctp:30099"},
		"KUBE-6-NODE-PORT-LOCAL-SCTP-HAS": {"fd00:18::10,sctp:30099"},
		"KUBE-6-HEALTH-CHECK-NODE-PORT":   {"32053", "32099"},
	}
	for s, w := range want {
		if diff := cmp.Diff(w, e[s]); diff != "" {
			t.Errorf("%s (-want +got):\n%s", s, diff)
		}
	}
	// fe80::1 and ::1 carry no node port.
	for k := range services(d) {
		if strings.Contains(k, "fe80::") || strings.Contains(k, "[::1]") {
			t.Errorf("node port on %s", k)
		}
	}
	if diff := cmp.Diff([]string{
		`-p udp -m comment --comment "Kubernetes nodeport UDP port with externalTrafficPolicy=local" -m set --match-set KUBE-6-NODE-PORT-LOCAL-UDP dst -j RETURN`,
		`-p udp -m comment --comment "Kubernetes nodeport UDP port for masquerade purpose" -m set --match-set KUBE-6-NODE-PORT-UDP dst -j KUBE-MARK-MASQ`,
		`-p sctp -m comment --comment "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'" -m set --match-set KUBE-6-NODE-PORT-LOCAL-SCTP-HAS dst,dst -j RETURN`,
		`-p sctp -m comment --comment "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'" -m set --match-set KUBE-6-NODE-PORT-SCTP-HASH dst,dst -j KUBE-MARK-MASQ`,
	}, chainRules(d, TableNAT, ChainNodePort)); diff != "" {
		t.Errorf("nat KUBE-NODE-PORT (-want +got):\n%s", diff)
	}

	c.NodePortAddresses = []string{"::1/128"}
	e = entries(render(t, c, list...))
	if len(e["KUBE-6-NODE-PORT-UDP"]) != 0 || len(e["KUBE-6-HEALTH-CHECK-NODE-PORT"]) != 2 {
		t.Errorf("no node port address: %v", e)
	}
}
