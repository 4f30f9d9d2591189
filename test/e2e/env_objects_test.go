package e2e

// Cluster state through client-go: Services (TCP 80 and UDP 53 onto the
// pods' echo servers, load-balancer ingress from 198.19.200.0/24),
// EndpointSlices for the echo pods a1, a2 (node-a) and b1 (node-b), node-a's
// Node, and deleting them all when a test ends. The address plan is in
// env_test.go's top comment.

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

// Standard service ports: TCP 80 and UDP 53 onto the pods' echo servers.
var (
	portTCP = corev1.ServicePort{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(targetTCP)}
	portUDP = corev1.ServicePort{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(targetUDP)}
)

// createService creates a ClusterIP Service with a TCP port, edited by the
// given functions, and returns it as the API server completed it (with its
// allocated cluster IPs and node ports).
func (e *env) createService(name string, edits ...func(*corev1.Service)) *corev1.Service {
	e.t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.kns},
		Spec: corev1.ServiceSpec{
			Type:  corev1.ServiceTypeClusterIP,
			Ports: []corev1.ServicePort{portTCP},
		},
	}
	for _, edit := range edits {
		edit(svc)
	}
	out, err := e.cp.Client.CoreV1().Services(e.kns).Create(e.ctx, svc, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("creating Service %s: %v", name, err)
	}
	return out
}

// editService changes a Service (retrying on conflicts) and returns it as
// stored.
func (e *env) editService(name string, edit func(*corev1.Service)) *corev1.Service {
	e.t.Helper()
	return e.writeService(name, "updating", edit, e.cp.Client.CoreV1().Services(e.kns).Update)
}

// setLoadBalancerIngress sets the Service's status.loadBalancer.ingress, as
// a cloud controller would.
func (e *env) setLoadBalancerIngress(name string, ips ...netip.Addr) *corev1.Service {
	e.t.Helper()
	return e.writeService(name, "setting the load balancer ingress of", func(svc *corev1.Service) {
		svc.Status.LoadBalancer.Ingress = nil
		for _, ip := range ips {
			svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip.String()})
		}
	}, e.cp.Client.CoreV1().Services(e.kns).UpdateStatus)
}

// writeService reads Service name, changes it with edit and writes it
// with write (Update or UpdateStatus), retrying on conflicts; what names
// the step in the failure.
func (e *env) writeService(name, what string, edit func(*corev1.Service),
	write func(context.Context, *corev1.Service, metav1.UpdateOptions) (*corev1.Service, error)) *corev1.Service {
	e.t.Helper()
	var out *corev1.Service
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc, err := e.cp.Client.CoreV1().Services(e.kns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		edit(svc)
		out, err = write(e.ctx, svc, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		e.t.Fatalf("%s Service %s: %v", what, name, err)
	}
	return out
}

func (e *env) deleteService(name string) {
	e.t.Helper()
	if err := e.cp.Client.CoreV1().Services(e.kns).Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatalf("deleting Service %s: %v", name, err)
	}
}

// endpoint describes one endpoint of a slice: a pod, its conditions and
// topology hints.
type endpoint struct {
	pod string
	// state: "" ready; "terminating" serving and terminating; "stopping"
	// terminating and no longer serving; "unready" neither ready nor
	// terminating.
	state string
	// hintZone, hintNode: the EndpointSlice controller's hints (forZones,
	// forNodes), when set.
	hintZone, hintNode string
}

// podNode and podZone: where each pod runs. Node a is in zone-a, b in zone-b.
func podNode(pod string) string {
	if strings.HasPrefix(pod, "b") {
		return nodeB
	}
	return nodeA
}

func podZone(pod string) string { return "zone-" + strings.TrimPrefix(podNode(pod), "node-") }

// sliceName is the one EndpointSlice of a service for a family.
func sliceName(svc string, fam discoveryv1.AddressType) string {
	return svc + "-" + strings.ToLower(string(fam))
}

// setEndpoints creates or replaces the service's EndpointSlice of a family
// (IPv4 or IPv6) with eps, listing the TCP and UDP target ports. The
// trigger-time annotation is set to now, as the EndpointSlice controller
// sets it to the time of the change that caused the update (no controller
// runs here). It returns the trigger time.
func (e *env) setEndpoints(svc string, fam discoveryv1.AddressType, eps ...endpoint) time.Time {
	e.t.Helper()
	like := v4
	if fam == discoveryv1.AddressTypeIPv6 {
		like = v6
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:      sliceName(svc, fam),
			Namespace: e.kns,
			Labels: map[string]string{
				discoveryv1.LabelServiceName: svc,
				discoveryv1.LabelManagedBy:   "e2e.kproxy.io",
			},
		},
		AddressType: fam,
		Endpoints:   []discoveryv1.Endpoint{},
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To(portTCP.Name), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](targetTCP)},
			{Name: ptr.To(portUDP.Name), Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To[int32](targetUDP)},
		},
	}
	for _, ep := range eps {
		d := discoveryv1.Endpoint{
			Addresses: []string{e.podIP(ep.pod, like).String()},
			NodeName:  ptr.To(podNode(ep.pod)),
			Zone:      ptr.To(podZone(ep.pod)),
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: e.kns, Name: ep.pod},
		}
		switch ep.state {
		case "":
			d.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}
		case "terminating":
			d.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
		case "stopping":
			d.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(true)}
		case "unready":
			d.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(false)}
		default:
			e.t.Fatalf("endpoint %s: unknown state %q", ep.pod, ep.state)
		}
		if ep.hintZone != "" || ep.hintNode != "" {
			d.Hints = &discoveryv1.EndpointHints{}
			if ep.hintZone != "" {
				d.Hints.ForZones = []discoveryv1.ForZone{{Name: ep.hintZone}}
			}
			if ep.hintNode != "" {
				d.Hints.ForNodes = []discoveryv1.ForNode{{Name: ep.hintNode}}
			}
		}
		slice.Endpoints = append(slice.Endpoints, d)
	}
	var trigger time.Time
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := e.cp.Client.DiscoveryV1().EndpointSlices(e.kns).Get(e.ctx, slice.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			slice.ResourceVersion = ""
		case err != nil:
			return err
		default:
			slice.ResourceVersion = cur.ResourceVersion
		}
		trigger = time.Now()
		slice.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: trigger.UTC().Format(time.RFC3339Nano)}
		if slice.ResourceVersion == "" {
			_, err = e.cp.Client.DiscoveryV1().EndpointSlices(e.kns).Create(e.ctx, slice, metav1.CreateOptions{})
		} else {
			_, err = e.cp.Client.DiscoveryV1().EndpointSlices(e.kns).Update(e.ctx, slice, metav1.UpdateOptions{})
		}
		return err
	})
	if err != nil {
		e.t.Fatalf("writing EndpointSlice %s: %v", slice.Name, err)
	}
	return trigger
}

// editNode changes node-a's Node object (retrying on conflicts).
func (e *env) editNode(edit func(*corev1.Node)) {
	e.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := e.cp.Client.CoreV1().Nodes().Get(e.ctx, nodeA, metav1.GetOptions{})
		if err != nil {
			return err
		}
		edit(n)
		_, err = e.cp.Client.CoreV1().Nodes().Update(e.ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		e.t.Fatalf("updating Node %s: %v", nodeA, err)
	}
}

// deleteObjects removes the scenario's Services and EndpointSlices.
func (e *env) deleteObjects() {
	select {
	case <-e.cp.APIServer.Done():
		return // a disruption test's API server, stopped by a later cleanup
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := e.cp.Client
	var errs []error
	svcs, err := client.CoreV1().Services(e.kns).List(ctx, metav1.ListOptions{})
	errs = append(errs, err)
	if err == nil {
		for _, s := range svcs.Items {
			errs = append(errs, client.CoreV1().Services(e.kns).Delete(ctx, s.Name, metav1.DeleteOptions{}))
		}
	}
	errs = append(errs, client.DiscoveryV1().EndpointSlices(e.kns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}))
	if err := errors.Join(errs...); err != nil {
		// The API server may be down because the test failed half way
		// through an outage: say so, but do not fail for it.
		e.t.Logf("cleanup: deleting the objects of namespace %s: %v", e.kns, err)
	}
}
