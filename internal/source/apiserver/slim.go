package apiserver

import (
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/model"
)

// slim drops what the proxy never reads from the objects the informers
// keep, before they are stored: at tens of thousands of services the cache
// is most of kproxy's memory. managedFields and annotations (such as
// kubectl's last-applied-configuration, a copy of the whole object) go,
// except the EndpointSlice trigger time; of a Node, the image list and
// volume status, which can be tens of kilobytes.
func slim(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	switch o := obj.(type) {
	case *v1.Service:
		o.Annotations = nil
	case *discovery.EndpointSlice:
		if t, ok := o.Annotations[model.AnnotationTriggerTime]; ok {
			o.Annotations = map[string]string{model.AnnotationTriggerTime: t}
		} else {
			o.Annotations = nil
		}
	case *v1.Node:
		o.Annotations = nil
		o.Status.Images = nil
		o.Status.VolumesAttached = nil
		o.Status.VolumesInUse = nil
	}
	return obj, nil
}
