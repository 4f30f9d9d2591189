package apiserver

import (
	"maps"
	"testing"

	"github.com/google/go-cmp/cmp"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/internal/model"
)

func TestSlim(t *testing.T) {
	mf := []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
	big := map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{...}"}

	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s", ManagedFields: mf, Annotations: big, Labels: map[string]string{"app": "x"}},
		Spec: v1.ServiceSpec{ClusterIP: "198.19.0.1"}}
	slim(svc)
	if svc.ManagedFields != nil || svc.Annotations != nil || svc.Labels != nil || svc.Spec.ClusterIP != "198.19.0.1" {
		t.Errorf("service: %+v", svc.ObjectMeta)
	}

	trig := map[string]string{model.AnnotationTriggerTime: "2026-12-02T10:00:00Z", "other": "x"}
	sl := &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "e", ManagedFields: mf, Annotations: trig}}
	slim(sl)
	if sl.ManagedFields != nil || len(sl.Annotations) != 1 || sl.Annotations[model.AnnotationTriggerTime] == "" {
		t.Errorf("slice annotations: %v", sl.Annotations)
	}

	// Decoding leaves spare room in the endpoint list (protobuf appends
	// one by one): slim keeps only what is used.
	sl = &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "e"}}
	for range 10 {
		sl.Endpoints = append(sl.Endpoints, discovery.Endpoint{Addresses: []string{"198.18.129.10"}})
	}
	data, err := sl.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	decoded := &discovery.EndpointSlice{}
	if err := decoded.Unmarshal(data); err != nil {
		t.Fatal(err)
	}
	slim(decoded)
	if len(decoded.Endpoints) != 10 || cap(decoded.Endpoints) > 10 || decoded.Endpoints[9].Addresses[0] != "198.18.129.10" {
		t.Errorf("slice endpoints after slim: len %d cap %d", len(decoded.Endpoints), cap(decoded.Endpoints))
	}

	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: big, Labels: map[string]string{v1.LabelTopologyZone: "z"}},
		Spec:   v1.NodeSpec{PodCIDRs: []string{"198.18.129.0/24"}, Taints: []v1.Taint{{Key: model.TaintToBeDeleted}}},
		Status: v1.NodeStatus{Images: []v1.ContainerImage{{Names: []string{"x"}}}, Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "198.18.0.10"}}}}
	slim(node)
	if node.Annotations != nil || node.Status.Images != nil || len(node.Status.Addresses) != 1 || len(node.Spec.Taints) != 1 || node.Labels[v1.LabelTopologyZone] != "z" || len(node.Spec.PodCIDRs) != 1 {
		t.Errorf("node: %+v", node)
	}
}

// TestSlimKeepsWhatTheModelReads converts the same objects with and without
// slim: every decision and every model object must be the same, so slim
// drops only what the proxy never reads.
func TestSlimKeepsWhatTheModelReads(t *testing.T) {
	families := []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
	helm := map[string]string{"app.kubernetes.io/name": "web", "app.kubernetes.io/instance": "web-1", "helm.sh/chart": "web-1.2.3"}
	withLabel := func(k, v string) map[string]string {
		m := maps.Clone(helm)
		m[k] = v
		return m
	}
	port := func(name string, p int32, proto v1.Protocol) v1.ServicePort {
		return v1.ServicePort{Name: name, Port: p, Protocol: proto, TargetPort: intstr.FromInt32(8080), NodePort: 30080}
	}
	services := []*v1.Service{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", Labels: helm, CreationTimestamp: metav1.Unix(1767225600, 0)},
			Spec: v1.ServiceSpec{Type: v1.ServiceTypeNodePort, ClusterIP: "198.19.0.10", ClusterIPs: []string{"198.19.0.10", "fd00:19::10"},
				IPFamilies: families, Selector: map[string]string{"app": "web"}, Ports: []v1.ServicePort{port("http", 80, v1.ProtocolTCP), port("dns", 53, v1.ProtocolUDP)},
				ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyLocal, HealthCheckNodePort: 31000, SessionAffinity: v1.ServiceAffinityClientIP,
				SessionAffinityConfig: &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}},
			Status: v1.ServiceStatus{LoadBalancer: v1.LoadBalancerStatus{Ingress: []v1.LoadBalancerIngress{{IP: "198.19.100.1"}}},
				Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "other-proxy", Labels: withLabel(model.LabelServiceProxyName, "cilium")},
			Spec: v1.ServiceSpec{ClusterIP: "198.19.0.11", Ports: []v1.ServicePort{port("http", 80, v1.ProtocolTCP)}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "headless-label", Labels: withLabel(model.LabelHeadless, "")},
			Spec: v1.ServiceSpec{ClusterIP: "198.19.0.12", Ports: []v1.ServicePort{port("http", 80, v1.ProtocolTCP)}}},
	}
	ep := func(ip, node, zone string) discovery.Endpoint {
		return discovery.Endpoint{Addresses: []string{ip}, NodeName: ptr.To(node), Zone: ptr.To(zone), Hostname: ptr.To("pod-" + node),
			Conditions:         discovery.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			Hints:              &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: zone}}},
			TargetRef:          &v1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: "web-" + node, UID: "0b8f1e52-5a1f-4a55-9a38-1f1c6bd1b0a1"},
			DeprecatedTopology: map[string]string{v1.LabelHostname: node}}
	}
	slices := []*discovery.EndpointSlice{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-abc", Labels: withLabel(discovery.LabelServiceName, "web"),
			Annotations: map[string]string{model.AnnotationTriggerTime: "2026-12-02T10:00:00Z"}},
			AddressType: discovery.AddressTypeIPv4,
			Endpoints:   []discovery.Endpoint{ep("198.18.1.1", "node-a", "z1"), ep("198.18.2.1", "node-b", "z2")},
			Ports: []discovery.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)},
				{Name: ptr.To("dns"), Port: ptr.To[int32](53), Protocol: ptr.To(v1.ProtocolUDP)}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-def", Labels: withLabel(discovery.LabelServiceName, "web")},
			AddressType: discovery.AddressTypeIPv6,
			Endpoints:   []discovery.Endpoint{ep("fd00:18::1:1", "node-a", "z1")},
			Ports:       []discovery.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}}},
	}

	for _, svc := range services {
		slimmed := svc.DeepCopy()
		slim(slimmed)
		if got, want := model.SkipService(slimmed), model.SkipService(svc); got != want {
			t.Errorf("%s: SkipService %q after slim, %q before", svc.Name, got, want)
		}
		gotPorts, gotErrs := model.ConvertService(slimmed, families)
		wantPorts, wantErrs := model.ConvertService(svc, families)
		if diff := cmp.Diff(wantPorts, gotPorts); diff != "" || len(gotErrs) != len(wantErrs) {
			t.Errorf("%s: model differs after slim (-before +after):\n%s errors %v vs %v", svc.Name, diff, wantErrs, gotErrs)
		}
		if svc.Spec.Selector != nil && slimmed.Spec.Selector != nil {
			t.Errorf("%s: selector kept", svc.Name)
		}
	}

	var slimmedSlices []*discovery.EndpointSlice
	for _, s := range slices {
		c := s.DeepCopy()
		slim(c)
		slimmedSlices = append(slimmedSlices, c)
		gotKey, gotOK := model.ServiceKeyOfSlice(c)
		wantKey, wantOK := model.ServiceKeyOfSlice(s)
		if gotKey != wantKey || gotOK != wantOK {
			t.Errorf("%s: service key %v %v after slim, %v %v before", s.Name, gotKey, gotOK, wantKey, wantOK)
		}
		if c.Endpoints[0].TargetRef != nil || len(c.Labels) != 1 {
			t.Errorf("%s: targetRef %v, labels %v after slim", s.Name, c.Endpoints[0].TargetRef, c.Labels)
		}
	}
	for _, host := range []string{"node-a", "node-b"} {
		got, gotErrs := model.ConvertEndpointSlices(slimmedSlices, host, families)
		want, wantErrs := model.ConvertEndpointSlices(slices, host, families)
		if diff := cmp.Diff(want, got); diff != "" || len(gotErrs) != len(wantErrs) {
			t.Errorf("host %s: endpoints differ after slim (-before +after):\n%s errors %v vs %v", host, diff, wantErrs, gotErrs)
		}
		if len(want[v1.IPv4Protocol]) == 0 {
			t.Fatalf("host %s: the fixture converts to no IPv4 endpoints; the comparison would prove nothing", host)
		}
	}
}
