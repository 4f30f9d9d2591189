package apiserver

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/model"
)

func TestSlim(t *testing.T) {
	mf := []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
	big := map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{...}"}

	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s", ManagedFields: mf, Annotations: big, Labels: map[string]string{"app": "x"}},
		Spec: v1.ServiceSpec{ClusterIP: "198.19.0.1"}}
	slim(svc)
	if svc.ManagedFields != nil || svc.Annotations != nil || svc.Labels["app"] != "x" || svc.Spec.ClusterIP != "198.19.0.1" {
		t.Errorf("service: %+v", svc.ObjectMeta)
	}

	trig := map[string]string{model.AnnotationTriggerTime: "2026-12-02T10:00:00Z", "other": "x"}
	sl := &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "e", ManagedFields: mf, Annotations: trig}}
	slim(sl)
	if sl.ManagedFields != nil || len(sl.Annotations) != 1 || sl.Annotations[model.AnnotationTriggerTime] == "" {
		t.Errorf("slice annotations: %v", sl.Annotations)
	}

	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: big, Labels: map[string]string{v1.LabelTopologyZone: "z"}},
		Spec:   v1.NodeSpec{PodCIDRs: []string{"198.18.129.0/24"}, Taints: []v1.Taint{{Key: model.TaintToBeDeleted}}},
		Status: v1.NodeStatus{Images: []v1.ContainerImage{{Names: []string{"x"}}}, Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "198.18.0.10"}}}}
	slim(node)
	if node.Annotations != nil || node.Status.Images != nil || len(node.Status.Addresses) != 1 || len(node.Spec.Taints) != 1 || node.Labels[v1.LabelTopologyZone] != "z" || len(node.Spec.PodCIDRs) != 1 {
		t.Errorf("node: %+v", node)
	}
}
