package apiserver

// Addresses: 198.19.0.0/16 service IPs, split over ServiceCIDR objects.

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	networking "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func makeServiceCIDR(name string, cidrs ...string) *networking.ServiceCIDR {
	return &networking.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       networking.ServiceCIDRSpec{CIDRs: cidrs},
	}
}

// waitServiceCIDRs waits until the last ServiceCIDRs event lists want
// (the sorted CIDRs of every ServiceCIDR, comma-separated).
func (r *recorder) waitServiceCIDRs(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		var last *event
		for _, e := range r.snapshot() {
			if e.Kind == "ServiceCIDRs" {
				last = &e
			}
		}
		if last != nil && last.Key == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for ServiceCIDRs %q, last event: %v", want, last)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestServiceCIDRs: the source hands the tracker the CIDRs of every
// ServiceCIDR after each add, update and delete, and the tracker passes
// the union on.
func TestServiceCIDRs(t *testing.T) {
	client := fake.NewClientset(append(initialObjects(), makeServiceCIDR("kubernetes", "198.19.0.0/17"))...)
	h := start(t, client)
	h.rec.waitServiceCIDRs(t, "198.19.0.0/17")

	cidrs := client.NetworkingV1().ServiceCIDRs()
	extra, err := cidrs.Create(bg, makeServiceCIDR("extra", "198.19.128.0/18"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h.rec.waitServiceCIDRs(t, "198.19.0.0/17,198.19.128.0/18")

	extra.Spec.CIDRs = []string{"198.19.128.0/17"}
	if _, err := cidrs.Update(bg, extra, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.rec.waitServiceCIDRs(t, "198.19.0.0/17,198.19.128.0/17")
	u := h.tracker.Take()
	if got, want := fmt.Sprint(u.ServiceCIDRs), "[198.19.0.0/17 198.19.128.0/17]"; !u.ServiceCIDRsChanged || got != want {
		t.Errorf("tracker: changed=%v cidrs=%s, want %s", u.ServiceCIDRsChanged, got, want)
	}

	if err := cidrs.Delete(bg, "kubernetes", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.rec.waitServiceCIDRs(t, "198.19.128.0/17")
	if u := h.tracker.Take(); fmt.Sprint(u.ServiceCIDRs) != "[198.19.128.0/17]" {
		t.Errorf("tracker after delete: changed=%v cidrs=%v", u.ServiceCIDRsChanged, u.ServiceCIDRs)
	}
}

// TestSlimServiceCIDR: slim keeps the name and spec.cidrs, what the model
// reads, and drops the rest.
func TestSlimServiceCIDR(t *testing.T) {
	sc := makeServiceCIDR("kubernetes", "198.19.0.0/17", "fd00:19::/112")
	sc.Annotations = map[string]string{"a": "b"}
	sc.Labels = map[string]string{"c": "d"}
	sc.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kube-apiserver"}}
	sc.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue}}
	obj, err := slim(sc)
	if err != nil {
		t.Fatal(err)
	}
	got := obj.(*networking.ServiceCIDR)
	want := makeServiceCIDR("kubernetes", "198.19.0.0/17", "fd00:19::/112")
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("slimmed ServiceCIDR (-want +got):\n%s", diff)
	}
}
