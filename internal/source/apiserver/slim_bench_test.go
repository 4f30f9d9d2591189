package apiserver

import (
	"encoding/json"
	"fmt"
	"runtime"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/internal/model"
)

// BenchmarkSlimRetained reports the heap that the informer cache keeps per
// Service and per EndpointSlice (10 endpoints), decoded from the JSON the
// API server sends for objects as a Deployment + Helm chart create them,
// with and without slim.
func BenchmarkSlimRetained(b *testing.B) {
	svcJSON, sliceJSON := realisticObjects(b)
	for _, slimmed := range []bool{false, true} {
		b.Run(fmt.Sprintf("slim=%v", slimmed), func(b *testing.B) {
			const n = 2000
			for range b.N {
				keep := make([]any, 0, 2*n)
				before := heapInuse()
				for range n {
					var svc v1.Service
					var sl discovery.EndpointSlice
					if err := json.Unmarshal(svcJSON, &svc); err != nil {
						b.Fatal(err)
					}
					if err := json.Unmarshal(sliceJSON, &sl); err != nil {
						b.Fatal(err)
					}
					if slimmed {
						slim(&svc)
						slim(&sl)
					}
					keep = append(keep, &svc, &sl)
				}
				after := heapInuse()
				b.ReportMetric(float64(after-before)/n, "B/service+slice")
				runtime.KeepAlive(keep)
			}
		})
	}
}

func heapInuse() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// realisticObjects returns a Service and its EndpointSlice as the API
// server serves them: labels of a Helm chart, a selector, managedFields,
// kubectl's last-applied annotation, ten endpoints with targetRefs.
func realisticObjects(b *testing.B) (svcJSON, sliceJSON []byte) {
	labels := map[string]string{
		"app.kubernetes.io/name": "web", "app.kubernetes.io/instance": "web-prod", "app.kubernetes.io/version": "1.2.3",
		"app.kubernetes.io/component": "frontend", "app.kubernetes.io/part-of": "shop", "app.kubernetes.io/managed-by": "Helm",
		"helm.sh/chart": "web-1.2.3",
	}
	mf := []metav1.ManagedFieldsEntry{{Manager: "helm", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
		FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:labels":{".":{},"f:app.kubernetes.io/name":{},"f:helm.sh/chart":{}}},"f:spec":{"f:ports":{".":{},"k:{\"port\":80,\"protocol\":\"TCP\"}":{".":{},"f:name":{},"f:port":{},"f:protocol":{},"f:targetPort":{}}},"f:selector":{},"f:type":{}}}`)}}
	svc := &v1.Service{
		TypeMeta:   metav1.TypeMeta{Kind: "Service", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", UID: "5e1c8d5e-3c1b-4a4f-9d2a-0c6f1f3b2a11", ResourceVersion: "123456", Labels: labels, ManagedFields: mf},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: "198.19.0.10", ClusterIPs: []string{"198.19.0.10"},
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol}, IPFamilyPolicy: ptr.To(v1.IPFamilyPolicySingleStack),
			Selector: map[string]string{"app.kubernetes.io/name": "web", "app.kubernetes.io/instance": "web-prod"},
			Ports:    []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromString("http")}}},
	}
	sliceLabels := map[string]string{discovery.LabelServiceName: "web", discovery.LabelManagedBy: "endpointslice-controller.k8s.io"}
	for k, v := range labels {
		sliceLabels[k] = v
	}
	sl := &discovery.EndpointSlice{
		TypeMeta: metav1.TypeMeta{Kind: "EndpointSlice", APIVersion: "discovery.k8s.io/v1"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-x7k2p", UID: "7a2b9c1d-2e3f-4a5b-8c7d-9e0f1a2b3c4d", ResourceVersion: "123457",
			Labels: sliceLabels, ManagedFields: mf, Annotations: map[string]string{model.AnnotationTriggerTime: "2026-12-02T10:00:00Z"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "web", UID: "5e1c8d5e-3c1b-4a4f-9d2a-0c6f1f3b2a11", Controller: ptr.To(true)}}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
	for i := range 10 {
		sl.Endpoints = append(sl.Endpoints, discovery.Endpoint{
			Addresses:  []string{fmt.Sprintf("198.18.%d.%d", 1+i/5, 10+i)},
			Conditions: discovery.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(fmt.Sprintf("node-%d", i%5)), Zone: ptr.To("zone-a"),
			TargetRef: &v1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: fmt.Sprintf("web-7d9f8b6c5d-%05d", i),
				UID: "9f8e7d6c-5b4a-3c2d-1e0f-a1b2c3d4e5f6"},
		})
	}
	var err error
	if svcJSON, err = json.Marshal(svc); err != nil {
		b.Fatal(err)
	}
	if sliceJSON, err = json.Marshal(sl); err != nil {
		b.Fatal(err)
	}
	return svcJSON, sliceJSON
}
