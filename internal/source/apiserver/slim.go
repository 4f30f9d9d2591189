package apiserver

import (
	v1 "k8s.io/api/core/v1"
	networking "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// slim drops what the proxy never reads from the objects the Node and
// ServiceCIDR informers keep, before they are stored (Services and
// EndpointSlices are not kept at all: deliveringStore). What goes:
//   - managedFields, owner references and finalizers;
//   - of a Node, its annotations, the image list and volume status,
//     which can be tens of kilobytes. Its labels stay: topology uses them;
//   - of a ServiceCIDR, everything but spec.cidrs and its name.
func slim(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
		m.SetOwnerReferences(nil)
		m.SetFinalizers(nil)
	}
	switch o := obj.(type) {
	case *networking.ServiceCIDR:
		// Only spec.cidrs is read.
		o.Annotations, o.Labels = nil, nil
		o.Status.Conditions = nil
	case *v1.Node:
		o.Annotations = nil
		o.Status.Images = nil
		o.Status.VolumesAttached = nil
		o.Status.VolumesInUse = nil
	}
	return obj, nil
}
