package e2e

// Objects the API server accepts that could break or open a node: names
// at the API's length limits, an external IP claiming another
// Service's cluster IP (CVE-2020-8554), and source ranges of the other
// family only. Addresses: see env_test.go.

import (
	"context"
	"net/http"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/internal/testutil/netns"
)

func scenarioAPIEdgeCases(e *env) {
	t := e.t
	web := e.createService("web")
	webCIP := ap(clusterIP(web, v4), 80)
	e.setEndpoints("web", ipv4, endpoint{pod: podA1})
	e.expectServers(client, "tcp", webCIP, podA1)

	// 1. Namespace and name of 63 characters, a port name of 15: element
	// comments and names over nf_tables' limits unless kproxy bounds them.
	longNS := strings.TrimRight((e.kns + "-" + strings.Repeat("n", 63))[:63], "-")
	longName := "s" + strings.Repeat("x", 62)
	const longPort = "http-port-12345"
	e.createNamespace(longNS)
	svc, err := e.cp.Client.CoreV1().Services(longNS).Create(e.ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: longName, Namespace: longNS},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Ports: []corev1.ServicePort{
			{Name: longPort, Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(targetTCP)},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating the long-named Service: %v", err)
	}
	_, err = e.cp.Client.DiscoveryV1().EndpointSlices(longNS).Create(e.ctx, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: longName[:50] + "-ipv4", Namespace: longNS,
			Labels: map[string]string{discoveryv1.LabelServiceName: longName, discoveryv1.LabelManagedBy: "e2e.kproxy.io"}},
		AddressType: ipv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{e.podIP(podB1, v4).String()}, NodeName: ptr.To(nodeB),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To(longPort), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](targetTCP)}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating the long-named Service's EndpointSlice: %v", err)
	}
	longCIP := ap(clusterIP(svc, v4), 80)
	e.expectServers(client, "tcp", longCIP, podB1)
	e.expectServers(testerA, "tcp", longCIP, podB1)
	e.expectServers(client, "tcp", webCIP, podA1)
	e.expectHealth("/healthz", http.StatusOK, ptr.To(true))

	// 2. An external IP claiming web's cluster IP and port: web keeps
	// its traffic, on a running proxy and after a restart.
	intruder := e.createService("intruder", func(s *corev1.Service) { s.Spec.ExternalIPs = []string{webCIP.Addr().String()} })
	e.setEndpoints("intruder", ipv4, endpoint{pod: podB1})
	e.expectServers(client, "tcp", ap(clusterIP(intruder, v4), 80), podB1)
	e.expectServers(client, "tcp", webCIP, podA1)
	e.expectServers(testerA, "tcp", webCIP, podA1)
	e.killKproxy()
	e.startKproxy()
	e.waitFirstSync()
	e.expectServers(client, "tcp", ap(clusterIP(intruder, v4), 80), podB1)
	e.expectServers(client, "tcp", webCIP, podA1)
	e.expectServers(testerA, "tcp", webCIP, podA1)

	// 3. Source ranges of IPv6 only on an IPv4 load balancer: closed to
	// IPv4 clients (upstream leaves it open); ranges that hold the client
	// let it in.
	closed := e.createService("closed-lb", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.LoadBalancerSourceRanges = []string{"fd00:18::/64"}
	})
	e.setLoadBalancerIngress("closed-lb", lbIP)
	e.setEndpoints("closed-lb", ipv4, endpoint{pod: podA1})
	openIP := lbIP.Next()
	e.createService("open-lb", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.LoadBalancerSourceRanges = []string{"198.18.0.0/24"}
	})
	e.setLoadBalancerIngress("open-lb", openIP)
	e.setEndpoints("open-lb", ipv4, endpoint{pod: podA1})
	e.expectServers(client, "tcp", ap(openIP, 80), podA1)
	// The closed service is programmed (its cluster IP answers) ...
	e.expectServers(client, "tcp", ap(clusterIP(closed, v4), 80), podA1)
	// ... and its load balancer IP is not, three times in a row.
	for i := range 3 {
		if r := request(e.ns(client), "tcp", ap(lbIP, 80)); r.Outcome == netns.Answered {
			t.Fatalf("attempt %d: the load balancer with IPv6 source ranges only answered an IPv4 client: %v", i+1, r)
		}
	}
	e.alive()
}

// createNamespace creates a further namespace for the scenario; its
// Services and EndpointSlices are deleted when the scenario ends.
func (e *env) createNamespace(name string) {
	e.t.Helper()
	if _, err := e.cp.Client.CoreV1().Namespaces().Create(e.ctx,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("creating namespace %s: %v", name, err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c := e.cp.Client
		svcs, err := c.CoreV1().Services(name).List(ctx, metav1.ListOptions{})
		if err == nil {
			for _, s := range svcs.Items {
				_ = c.CoreV1().Services(name).Delete(ctx, s.Name, metav1.DeleteOptions{})
			}
		}
		_ = c.DiscoveryV1().EndpointSlices(name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	})
}
