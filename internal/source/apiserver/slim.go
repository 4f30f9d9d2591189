package apiserver

import (
	"slices"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networking "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/model"
)

// slim drops what the proxy never reads from the objects the informers
// keep, before they are stored: at tens of thousands of services the cache
// is most of kproxy's memory. What goes:
//   - managedFields, owner references, finalizers, and annotations (such as kubectl's
//     last-applied-configuration, a copy of the whole object), except the
//     EndpointSlice trigger time;
//   - of a Service, its selector, its status conditions and every label
//     but the two that decide whether it is proxied (a Helm chart's labels
//     are often the largest part of the object);
//   - of an EndpointSlice, every label but the service name and those two,
//     and each endpoint's targetRef, hostname and deprecatedTopology (a
//     targetRef is ~150 bytes, ten per slice), and the spare room decoding
//     left in its list of endpoints;
//   - of a Node, the image list and volume status, which can be tens of
//     kilobytes. Its labels stay: topology uses them;
//   - of a ServiceCIDR, everything but spec.cidrs and its name.
//
// metadata.creationTimestamp stays: it decides which Service keeps an
// address two of them claim (model/resolve.go).
//
// TestSlimKeepsWhatTheModelReads converts objects before and after slim and
// requires the same model.
func slim(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
		m.SetOwnerReferences(nil)
		m.SetFinalizers(nil)
	}
	switch o := obj.(type) {
	case *v1.Service:
		o.Annotations = nil
		o.Labels = keepLabels(o.Labels, model.LabelServiceProxyName, model.LabelHeadless)
		o.Spec.Selector = nil
		o.Status.Conditions = nil
	case *discovery.EndpointSlice:
		if t, ok := o.Annotations[model.AnnotationTriggerTime]; ok {
			o.Annotations = map[string]string{model.AnnotationTriggerTime: t}
		} else {
			o.Annotations = nil
		}
		o.Labels = keepLabels(o.Labels, discovery.LabelServiceName, model.LabelServiceProxyName, model.LabelHeadless)
		if cap(o.Endpoints) > len(o.Endpoints) {
			// Decoding appends endpoint by endpoint: ten come with room
			// for eighteen (~700 bytes a slice at 96 bytes each).
			o.Endpoints = slices.Clone(o.Endpoints)
		}
		for i := range o.Endpoints {
			e := &o.Endpoints[i]
			e.TargetRef = nil
			e.Hostname = nil
			e.DeprecatedTopology = nil
		}
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

// keepLabels returns the labels among keys, or nil when there are none.
func keepLabels(labels map[string]string, keys ...string) map[string]string {
	var out map[string]string
	for _, k := range keys {
		if v, ok := labels[k]; ok {
			if out == nil {
				out = make(map[string]string, len(keys))
			}
			out[k] = v
		}
	}
	return out
}
