package model

// Addresses: 198.19.0.0/16 and fd00:19::/112 service IPs, split over
// ServiceCIDR objects.

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	networking "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/metrics"
)

func makeServiceCIDR(name string, cidrs ...string) *networking.ServiceCIDR {
	return &networking.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networking.ServiceCIDRSpec{CIDRs: cidrs}}
}

// TestTrackerServiceCIDRs: the tracker passes on the union of every
// ServiceCIDR's CIDRs once per change, and skips (with a report naming the
// object) a CIDR that does not parse, keeping the others.
func TestTrackerServiceCIDRs(t *testing.T) {
	var invalid []*InvalidError
	changes := 0
	tr := NewTracker(TrackerOptions{Hostname: "node-a", Families: []v1.IPFamily{IPv4, IPv6},
		OnInvalid: func(e *InvalidError) { invalid = append(invalid, e) }, OnChange: func() { changes++ }})
	counter := metrics.InvalidObjectsTotal.WithLabelValues("ServiceCIDR", ReasonInvalidPart)
	before := testutil.ToFloat64(counter)

	tr.ServiceCIDRsUpdated([]*networking.ServiceCIDR{
		makeServiceCIDR("kubernetes", "198.19.0.0/17", "fd00:19::/112"),
		makeServiceCIDR("extra", "198.19.128.0/17", "not-a-cidr", "198.19.0.0/17"),
	})
	u := tr.Take()
	if u.Empty() || !u.ServiceCIDRsChanged {
		t.Fatalf("update does not carry the ServiceCIDRs: %+v", u)
	}
	if got, want := fmt.Sprint(u.ServiceCIDRs), "[198.19.0.0/17 198.19.128.0/17 fd00:19::/112]"; got != want {
		t.Errorf("service CIDRs = %s, want %s", got, want)
	}
	if got, want := fmt.Sprint(PrefixesOf(u.ServiceCIDRs, IPv6)), "[fd00:19::/112]"; got != want {
		t.Errorf("IPv6 service CIDRs = %s, want %s", got, want)
	}
	if len(invalid) != 1 || invalid[0].Kind != "ServiceCIDR" || invalid[0].Object != "extra" || invalid[0].Field != "spec.cidrs[1]" {
		t.Errorf("invalid CIDR reports = %v, want one for ServiceCIDR extra spec.cidrs[1]", invalid)
	}
	if d := testutil.ToFloat64(counter) - before; d != 1 {
		t.Errorf("kproxy_invalid_objects_total{kind=ServiceCIDR} grew by %v, want 1", d)
	}

	// The same CIDRs again (a resync, or one more object with nothing
	// new): no change.
	changes = 0
	tr.ServiceCIDRsUpdated([]*networking.ServiceCIDR{
		makeServiceCIDR("kubernetes", "198.19.0.0/17", "fd00:19::/112"),
		makeServiceCIDR("extra", "198.19.128.0/17"),
	})
	if u := tr.Take(); !u.Empty() || u.ServiceCIDRsChanged || changes != 0 {
		t.Errorf("unchanged CIDRs: update %+v, %d change calls", u, changes)
	}

	// Changed and changed back before a Take: nothing to do.
	tr.ServiceCIDRsUpdated(nil)
	tr.ServiceCIDRsUpdated([]*networking.ServiceCIDR{makeServiceCIDR("kubernetes", "198.19.0.0/17", "fd00:19::/112", "198.19.128.0/17")})
	if u := tr.Take(); u.ServiceCIDRsChanged {
		t.Errorf("CIDRs changed back before a Take still reported: %v", u.ServiceCIDRs)
	}

	tr.ServiceCIDRsUpdated(nil)
	if u := tr.Take(); !u.ServiceCIDRsChanged || len(u.ServiceCIDRs) != 0 {
		t.Errorf("all ServiceCIDRs deleted: changed=%v cidrs=%v", u.ServiceCIDRsChanged, u.ServiceCIDRs)
	}
}
