package apiserver

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/model"
)

func TestSlimNode(t *testing.T) {
	big := map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{...}"}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: big, Labels: map[string]string{v1.LabelTopologyZone: "z"},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}},
		Spec:   v1.NodeSpec{PodCIDRs: []string{"198.18.129.0/24"}, Taints: []v1.Taint{{Key: model.TaintToBeDeleted}}},
		Status: v1.NodeStatus{Images: []v1.ContainerImage{{Names: []string{"x"}}}, Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "198.18.0.10"}}}}
	slim(node)
	if node.Annotations != nil || node.ManagedFields != nil || node.Status.Images != nil {
		t.Errorf("node keeps what slim drops: %+v", node)
	}
	// What the model reads of a Node stays.
	if len(node.Status.Addresses) != 1 || len(node.Spec.Taints) != 1 || node.Labels[v1.LabelTopologyZone] != "z" || len(node.Spec.PodCIDRs) != 1 {
		t.Errorf("node lost what the model reads: %+v", node)
	}
}
