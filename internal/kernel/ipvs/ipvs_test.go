package ipvs

// Address ranges used below:
//   10.96.0.0/16, fd00:96::/112   service cluster IPs (bound to kube-ipvs0)
//   192.168.1.0/24, fd00:192::/64 node addresses
//   192.0.2.0/24                  another load balancer's VIPs (keepalived), not local

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

var a = netip.MustParseAddr

// equateAddrs lets cmp compare netip.Addr values.
var equateAddrs = cmpopts.EquateComparable(netip.Addr{})

func tcp(addr string, port uint16) VirtualServer {
	return VirtualServer{Protocol: protoTCP, Addr: a(addr), Port: port}
}

func udp(addr string, port uint16) VirtualServer {
	return VirtualServer{Protocol: protoUDP, Addr: a(addr), Port: port}
}

// fakeKernel holds a state and records what is removed, in order.
type fakeKernel struct {
	s    state
	errs map[string]error // by operation: "deleteVS <vs>", "deleteLink", "destroy <set>", "ipsets"...
	log  []string
}

var _ kernel = (*fakeKernel)(nil)

func (f *fakeKernel) err(op string) error { return f.errs[op] }

func (f *fakeKernel) link(string) (bool, []netip.Addr, error) {
	return f.s.link, f.s.linkAddrs, f.err("link")
}

func (f *fakeKernel) deleteLink(name string) error {
	if err := f.err("deleteLink"); err != nil {
		return err
	}
	f.log = append(f.log, "link "+name)
	f.s.link, f.s.linkAddrs = false, nil
	return nil
}

func (f *fakeKernel) localAddrs() ([]netip.Addr, error) { return f.s.localAddrs, f.err("localAddrs") }

func (f *fakeKernel) ipsets() ([]ipset, error) { return f.s.sets, f.err("ipsets") }

func (f *fakeKernel) destroyIPSet(name string) error {
	if err := f.err("destroy " + name); err != nil {
		return err
	}
	f.log = append(f.log, "ipset "+name)
	f.s.sets = slices.DeleteFunc(f.s.sets, func(s ipset) bool { return s.Name == name })
	return nil
}

func (f *fakeKernel) ipvsAvailable() (bool, error) { return f.s.ipvs, f.err("ipvsAvailable") }

func (f *fakeKernel) virtualServers() ([]VirtualServer, error) {
	if !f.s.ipvs {
		return nil, errors.New("fake: no IPVS")
	}
	return f.s.servers, f.err("virtualServers")
}

func (f *fakeKernel) deleteVirtualServer(vs VirtualServer) error {
	if err := f.err("deleteVS " + vs.String()); err != nil {
		return err
	}
	f.log = append(f.log, "vs "+vs.String())
	f.s.servers = slices.DeleteFunc(f.s.servers, func(v VirtualServer) bool { return v == vs })
	return nil
}

func (f *fakeKernel) close() {}

// node is a node kube-proxy ran on in IPVS mode, next to keepalived.
func node() state {
	return state{
		link:      true,
		linkAddrs: []netip.Addr{a("10.96.0.1"), a("10.96.0.10"), a("fd00:96::1")},
		localAddrs: []netip.Addr{
			a("127.0.0.1"), a("192.168.1.5"), a("fd00:192::5"),
			a("10.96.0.1"), a("10.96.0.10"), a("fd00:96::1"),
		},
		sets: []ipset{
			{Name: "KUBE-CLUSTER-IP"},
			{Name: "KUBE-IPVS-IPS", Addrs: []netip.Addr{a("10.96.0.1"), a("10.96.0.10"), a("10.96.0.99")}},
			{Name: "KUBE-NODE-PORT-TCP", Ports: []portEntry{{Port: 30080}}},
			{Name: "KUBE-NODE-PORT-UDP", Ports: []portEntry{{Port: 30053}}},
			{Name: "KUBE-6-NODE-PORT-TCP", Ports: []portEntry{{Port: 30080}}},
			{Name: "KUBE-SRC-DQZ3TM3B6LDWP5K4"}, // kube-router's
			{Name: "cali40all-hosts-net"},       // Calico's
		},
		ipvs: true,
		servers: []VirtualServer{
			tcp("10.96.0.1", 443),
			udp("10.96.0.10", 53),
			tcp("10.96.0.99", 80), // in KUBE-IPVS-IPS only: the address was already unbound
			tcp("fd00:96::1", 443),
			tcp("192.168.1.5", 30080), // NodePort
			udp("192.168.1.5", 30053), // NodePort
			tcp("fd00:192::5", 30080), // NodePort
			udp("192.168.1.5", 30080), // not a UDP node port
			tcp("192.168.1.5", 8443),  // the user's own service on the node
			tcp("192.0.2.10", 30080),  // keepalived VIP, not local: not kube-proxy's
			{FWMark: 7, Family: 2},    // never kube-proxy's
			tcp("192.0.2.10", 443),    // keepalived
		},
	}
}

func TestPlan(t *testing.T) {
	tests := []struct {
		name  string
		state func() state
		want  Leftovers
	}{
		{
			name:  "IPVS mode node next to keepalived, kube-router and Calico",
			state: node,
			want: Leftovers{
				Link:   DummyDevice,
				IPSets: []string{"KUBE-CLUSTER-IP", "KUBE-IPVS-IPS", "KUBE-NODE-PORT-TCP", "KUBE-NODE-PORT-UDP", "KUBE-6-NODE-PORT-TCP"},
				VirtualServers: []VirtualServer{
					tcp("10.96.0.1", 443), udp("10.96.0.10", 53), tcp("10.96.0.99", 80), tcp("fd00:96::1", 443),
					tcp("192.168.1.5", 30080), udp("192.168.1.5", 30053), tcp("fd00:192::5", 30080),
				},
				IPVSChecked: true,
			},
		},
		{
			name: "kube-ipvs0 already gone: KUBE-IPVS-IPS still tells the service addresses",
			state: func() state {
				s := node()
				s.link, s.linkAddrs = false, nil
				return s
			},
			want: Leftovers{
				IPSets: []string{"KUBE-CLUSTER-IP", "KUBE-IPVS-IPS", "KUBE-NODE-PORT-TCP", "KUBE-NODE-PORT-UDP", "KUBE-6-NODE-PORT-TCP"},
				VirtualServers: []VirtualServer{
					tcp("10.96.0.1", 443), udp("10.96.0.10", 53), tcp("10.96.0.99", 80),
					tcp("192.168.1.5", 30080), udp("192.168.1.5", 30053), tcp("fd00:192::5", 30080),
				},
				IPVSChecked: true,
			},
		},
		{
			name: "no sets: only kube-ipvs0's addresses identify virtual servers",
			state: func() state {
				s := node()
				s.sets = nil
				return s
			},
			want: Leftovers{
				Link:           DummyDevice,
				VirtualServers: []VirtualServer{tcp("10.96.0.1", 443), udp("10.96.0.10", 53), tcp("fd00:96::1", 443)},
				IPVSChecked:    true,
			},
		},
		{
			name: "kernel without IPVS",
			state: func() state {
				s := node()
				s.ipvs, s.servers = false, nil
				return s
			},
			want: Leftovers{
				Link:   DummyDevice,
				IPSets: []string{"KUBE-CLUSTER-IP", "KUBE-IPVS-IPS", "KUBE-NODE-PORT-TCP", "KUBE-NODE-PORT-UDP", "KUBE-6-NODE-PORT-TCP"},
			},
		},
		{
			name: "only other tools' things",
			state: func() state {
				return state{
					sets:    []ipset{{Name: "KUBE-DST-XYZ"}, {Name: "KUBE-6-SRC-XYZ"}, {Name: "KUBE-CLUSTER-IPS"}},
					ipvs:    true,
					servers: []VirtualServer{tcp("192.0.2.10", 443)},
				}
			},
			want: Leftovers{IPVSChecked: true},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := plan(tc.state())
			if d := cmp.Diff(tc.want, got, equateAddrs); d != "" {
				t.Errorf("plan (-want +got):\n%s", d)
			}
			if got.Empty() != (tc.want.Link == "" && len(tc.want.IPSets) == 0 && len(tc.want.VirtualServers) == 0) {
				t.Errorf("Empty() = %v", got.Empty())
			}
		})
	}
}

func TestCleanupLeftovers(t *testing.T) {
	t.Run("order: virtual servers, the interface, then the sets", func(t *testing.T) {
		f := &fakeKernel{s: node()}
		if err := CleanupLeftovers(context.Background(), withKernel(f)); err != nil {
			t.Fatal(err)
		}
		want := []string{
			"vs TCP 10.96.0.1:443", "vs UDP 10.96.0.10:53", "vs TCP 10.96.0.99:80", "vs TCP [fd00:96::1]:443",
			"vs TCP 192.168.1.5:30080", "vs UDP 192.168.1.5:30053", "vs TCP [fd00:192::5]:30080",
			"link kube-ipvs0",
			"ipset KUBE-CLUSTER-IP", "ipset KUBE-IPVS-IPS", "ipset KUBE-NODE-PORT-TCP", "ipset KUBE-NODE-PORT-UDP", "ipset KUBE-6-NODE-PORT-TCP",
		}
		if d := cmp.Diff(want, f.log); d != "" {
			t.Errorf("removed (-want +got):\n%s", d)
		}
		// What is left is other tools' only.
		l, err := FindLeftovers(context.Background(), withKernel(f))
		if err != nil || !l.Empty() {
			t.Errorf("FindLeftovers after cleanup = %+v, %v; want empty", l, err)
		}
		var sets []string
		for _, s := range f.s.sets {
			sets = append(sets, s.Name)
		}
		if d := cmp.Diff([]string{"KUBE-SRC-DQZ3TM3B6LDWP5K4", "cali40all-hosts-net"}, sets); d != "" {
			t.Errorf("sets left (-want +got):\n%s", d)
		}
		if len(f.s.servers) != 5 {
			t.Errorf("virtual servers left: %v, want the 5 that are not kube-proxy's", f.s.servers)
		}
	})

	t.Run("errors do not stop the rest and are all returned", func(t *testing.T) {
		f := &fakeKernel{s: node(), errs: map[string]error{
			"deleteVS TCP 10.96.0.1:443": errors.New("EBUSY"),
			"destroy KUBE-CLUSTER-IP":    errors.New("errno 4103"),
		}}
		err := CleanupLeftovers(context.Background(), withKernel(f))
		if err == nil {
			t.Fatal("no error")
		}
		for _, want := range []string{"deleting virtual server TCP 10.96.0.1:443: EBUSY", "destroying ipset KUBE-CLUSTER-IP (an iptables rule may still use it): errno 4103"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		}
		if len(f.log) != 11 {
			t.Errorf("removed %d objects, want 11 (13 less the 2 failures): %v", len(f.log), f.log)
		}
	})

	t.Run("no ipset support in the kernel is not an error", func(t *testing.T) {
		s := node()
		s.sets = nil
		f := &fakeKernel{s: s, errs: map[string]error{"ipsets": fmt.Errorf("fake: %w", errUnsupported)}}
		if err := CleanupLeftovers(context.Background(), withKernel(f)); err != nil {
			t.Fatal(err)
		}
		if want := []string{"vs TCP 10.96.0.1:443", "vs UDP 10.96.0.10:53", "vs TCP [fd00:96::1]:443", "link kube-ipvs0"}; !slices.Equal(want, f.log) {
			t.Errorf("removed %v, want %v", f.log, want)
		}
	})

	t.Run("other read errors stop before anything is removed", func(t *testing.T) {
		f := &fakeKernel{s: node(), errs: map[string]error{"virtualServers": errors.New("EPERM")}}
		if err := CleanupLeftovers(context.Background(), withKernel(f)); err == nil || !strings.Contains(err.Error(), "EPERM") {
			t.Errorf("err = %v, want EPERM", err)
		}
		if len(f.log) != 0 {
			t.Errorf("removed %v after a failed read", f.log)
		}
	})
}

func TestSetSuffix(t *testing.T) {
	tests := map[string]string{
		"KUBE-CLUSTER-IP":                "CLUSTER-IP",
		"KUBE-6-CLUSTER-IP":              "CLUSTER-IP",
		"KUBE-6-IPVS-IPS":                "IPVS-IPS",
		"KUBE-NODE-PORT-LOCAL-SCTP-HASH": "NODE-PORT-LOCAL-SCTP-HASH",
		// IPv6 names longer than 31 characters are cut, as kube-proxy does.
		"KUBE-6-NODE-PORT-LOCAL-SCTP-HAS":  "NODE-PORT-LOCAL-SCTP-HASH",
		"KUBE-6-LOAD-BALANCER-SOURCE-CID":  "LOAD-BALANCER-SOURCE-CIDR",
		"KUBE-6-LOAD-BALANCER-SOURCE-CIDR": "",
		"KUBE-SRC-DQZ3TM3B6LDWP5K4":        "",
		"KUBE-6-SRC-DQZ3TM3B6LDWP5K4":      "",
		"KUBE-CLUSTER-IPS":                 "",
		"CLUSTER-IP":                       "",
	}
	for name, want := range tests {
		if got := setSuffix(name); got != want {
			t.Errorf("setSuffix(%q) = %q, want %q", name, got, want)
		}
	}
	for _, n := range kubeProxySetNames() {
		if len(n) > maxSetName {
			t.Errorf("set name %q is longer than the kernel allows", n)
		}
	}
}
