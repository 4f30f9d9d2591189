package model

// Addresses used by the tests of this package (all from ranges reserved for
// benchmarking and unique local use, so nothing here can reach a real host):
//
//	198.18.0.0/16  nodes and pods: 198.18.0.x nodes, 198.18.1.x and 198.18.2.x pods
//	198.19.0.0/16  service IPs: 198.19.0.x cluster IPs, 198.19.1.x external IPs,
//	               198.19.2.x load balancer ingress IPs
//	fd00::/8       IPv6 ULAs: fd00:18::/32 nodes and pods, fd00:19::/32 service IPs
//	               (fd00:19::x cluster IPs, fd00:19:1::x external, fd00:19:2::x ingress)

import (
	"flag"
	"io"
	"net/netip"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/klog/v2"
)

const (
	testNS   = "ns"
	thisNode = "node-a"
)

// makeService returns a single-stack IPv4 ClusterIP service with one port
// "http" 80/TCP → 8080, edited by tweak.
func makeService(ns, name string, tweak func(*v1.Service)) *v1.Service {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  "198.19.0.1",
			ClusterIPs: []string{"198.19.0.1"},
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol},
			Ports: []v1.ServicePort{{
				Name: "http", Port: 80, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromInt32(8080),
			}},
		},
	}
	if tweak != nil {
		tweak(svc)
	}
	return svc
}

// dualStack makes a service dual-stack, IPv4 first.
func dualStack(svc *v1.Service) {
	svc.Spec.ClusterIP = "198.19.0.1"
	svc.Spec.ClusterIPs = []string{"198.19.0.1", "fd00:19::1"}
	svc.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
}

// makeSlice returns an EndpointSlice of service ns/svc with one port "http"
// 8080/TCP and no endpoints, edited by tweak.
func makeSlice(ns, svc, name string, at discovery.AddressType, tweak func(*discovery.EndpointSlice)) *discovery.EndpointSlice {
	s := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name,
			Labels: map[string]string{discovery.LabelServiceName: svc},
		},
		AddressType: at,
		Ports:       []discovery.EndpointPort{epPort("http", 8080, v1.ProtocolTCP)},
	}
	if tweak != nil {
		tweak(s)
	}
	return s
}

func epPort(name string, port int32, proto v1.Protocol) discovery.EndpointPort {
	return discovery.EndpointPort{Name: &name, Port: &port, Protocol: &proto}
}

// sliceEP returns a ready endpoint with one address, edited by tweaks.
func sliceEP(addr string, tweaks ...func(*discovery.Endpoint)) discovery.Endpoint {
	e := discovery.Endpoint{Addresses: []string{addr}}
	for _, t := range tweaks {
		t(&e)
	}
	return e
}

func onNode(n string) func(*discovery.Endpoint) {
	return func(e *discovery.Endpoint) { e.NodeName = &n }
}

func inZone(z string) func(*discovery.Endpoint) {
	return func(e *discovery.Endpoint) { e.Zone = &z }
}

func conditions(ready, serving, terminating *bool) func(*discovery.Endpoint) {
	return func(e *discovery.Endpoint) {
		e.Conditions = discovery.EndpointConditions{Ready: ready, Serving: serving, Terminating: terminating}
	}
}

// terminatingEP marks an endpoint as a serving, terminating pod.
func terminatingEP(e *discovery.Endpoint) {
	conditions(ptr(false), ptr(true), ptr(true))(e)
}

// unreadyEP marks an endpoint as a pod that is neither ready nor terminating.
func unreadyEP(e *discovery.Endpoint) {
	conditions(ptr(false), ptr(false), ptr(false))(e)
}

func hints(zones, nodes []string) func(*discovery.Endpoint) {
	return func(e *discovery.Endpoint) {
		h := &discovery.EndpointHints{}
		for _, z := range zones {
			h.ForZones = append(h.ForZones, discovery.ForZone{Name: z})
		}
		for _, n := range nodes {
			h.ForNodes = append(h.ForNodes, discovery.ForNode{Name: n})
		}
		e.Hints = h
	}
}

// makeNode returns a Node with the given name, edited by tweak.
func makeNode(name string, tweak func(*v1.Node)) *v1.Node {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if tweak != nil {
		tweak(n)
	}
	return n
}

func ptr[T any](v T) *T { return &v }

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

func prefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, addr(s))
	}
	return out
}

func spn(svc, port string, proto v1.Protocol) ServicePortName {
	return ServicePortName{NamespacedName: types.NamespacedName{Namespace: testNS, Name: svc}, Port: port, Protocol: proto}
}

// netipComparers let go-cmp compare the netip types, whose fields are unexported.
var netipComparers = cmp.Options{
	cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
	cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }),
}

// portValues dereferences the ports so that go-cmp compares them field by
// field instead of through ServicePort.Equal, which is itself under test.
func portValues(m map[v1.IPFamily]map[ServicePortName]*ServicePort) map[v1.IPFamily]map[ServicePortName]ServicePort {
	if m == nil {
		return nil
	}
	out := map[v1.IPFamily]map[ServicePortName]ServicePort{}
	for f, byName := range m {
		out[f] = map[ServicePortName]ServicePort{}
		for n, p := range byName {
			out[f][n] = *p
		}
	}
	return out
}

// endpointValues is portValues for endpoints.
func endpointValues(m map[v1.IPFamily]map[ServicePortName][]*Endpoint) map[v1.IPFamily]map[ServicePortName][]Endpoint {
	if m == nil {
		return nil
	}
	out := map[v1.IPFamily]map[ServicePortName][]Endpoint{}
	for f, byName := range m {
		out[f] = map[ServicePortName][]Endpoint{}
		for n, eps := range byName {
			for _, e := range eps {
				out[f][n] = append(out[f][n], *e)
			}
		}
	}
	return out
}

// fields returns the Field of each error, in order.
func fields(errs []*InvalidError) []string {
	var out []string
	for _, e := range errs {
		out = append(out, e.Field)
	}
	return out
}

// checkErrs asserts the kind, object and field paths of errs.
func checkErrs(t *testing.T, errs []*InvalidError, kind, object string, wantFields []string) {
	t.Helper()
	if diff := cmp.Diff(wantFields, fields(errs)); diff != "" {
		t.Errorf("error fields (-want +got):\n%s\nerrors: %v", diff, errs)
	}
	for _, e := range errs {
		if e.Kind != kind || e.Object != object {
			t.Errorf("error %q: kind/object = %s %s, want %s %s", e, e.Kind, e.Object, kind, object)
		}
		if e.Reason == "" {
			t.Errorf("error %q has no reason", e)
		}
	}
}

// TestMain silences klog: the code under test logs every invalid object it
// is fed, which would bury the test output.
func TestMain(m *testing.M) {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("alsologtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	klog.SetOutput(io.Discard)
	os.Exit(m.Run())
}
