package proxy

// Address plan: 198.19.0.0/16 and fd00:19::/112 service IPs (split into
// ServiceCIDR objects below).

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	networking "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kproxy/kproxy/internal/model"
)

func makeServiceCIDR(name string, cidrs ...string) *networking.ServiceCIDR {
	return &networking.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networking.ServiceCIDRSpec{CIDRs: cidrs}}
}

// TestLoopServiceCIDRs: a change of the ServiceCIDRs' CIDRs forces a full
// sync of every family and reaches each family's request with only that
// family's CIDRs; the same CIDRs again (an informer resync) change nothing.
func TestLoopServiceCIDRs(t *testing.T) {
	ctx := context.Background()
	tr := model.NewTracker(model.TrackerOptions{Hostname: "node-a", Families: []v1.IPFamily{model.IPv4, model.IPv6}})
	b4, b6 := &recordingBackend{}, &recordingBackend{}
	clk := clocktesting.NewFakeClock(time.Now())
	l := New(Options{Tracker: tr, Backends: map[v1.IPFamily]Backend{model.IPv4: b4, model.IPv6: b6}, SyncPeriod: time.Hour, Clock: clk})
	tr.Synced()
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if r := b4.last(t); len(r.ServiceCIDRs) != 0 {
		t.Fatalf("service CIDRs before any ServiceCIDR: %v", r.ServiceCIDRs)
	}

	check := func(step string, want4, want6 []string) {
		t.Helper()
		before4, before6 := len(b4.reqs), len(b6.reqs)
		if err := l.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			f      v1.IPFamily
			b      *recordingBackend
			before int
			want   []string
		}{{model.IPv4, b4, before4, want4}, {model.IPv6, b6, before6, want6}} {
			if len(c.b.reqs) != c.before+1 {
				t.Fatalf("%s: %s backend called %d times, want once", step, c.f, len(c.b.reqs)-c.before)
			}
			r := c.b.last(t)
			if !r.Full {
				t.Errorf("%s: %s sync not full", step, c.f)
			}
			if got := fmt.Sprint(r.ServiceCIDRs); got != fmt.Sprint(prefixes(t, c.want...)) {
				t.Errorf("%s: %s service CIDRs = %s, want %v", step, c.f, got, c.want)
			}
		}
	}

	tr.ServiceCIDRsUpdated([]*networking.ServiceCIDR{makeServiceCIDR("kubernetes", "198.19.0.0/17", "fd00:19::/112")})
	check("first ServiceCIDR", []string{"198.19.0.0/17"}, []string{"fd00:19::/112"})

	more := []*networking.ServiceCIDR{
		makeServiceCIDR("kubernetes", "198.19.0.0/17", "fd00:19::/112"),
		makeServiceCIDR("extra", "198.19.128.0/17"),
	}
	tr.ServiceCIDRsUpdated(more)
	check("second ServiceCIDR", []string{"198.19.0.0/17", "198.19.128.0/17"}, []string{"fd00:19::/112"})

	// A resync re-delivers the same objects: no sync at all.
	tr.ServiceCIDRsUpdated(more)
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if len(b4.reqs) != 3 || len(b6.reqs) != 3 {
		t.Fatalf("unchanged ServiceCIDRs caused a sync: %d, %d calls", len(b4.reqs), len(b6.reqs))
	}

	// A partial sync afterwards still carries them.
	tr.ServiceUpdated(makeService("a", "198.19.0.1"))
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if r := b4.last(t); r.Full || fmt.Sprint(r.ServiceCIDRs) != fmt.Sprint(prefixes(t, "198.19.0.0/17", "198.19.128.0/17")) {
		t.Errorf("partial sync: full=%v service CIDRs=%v", r.Full, r.ServiceCIDRs)
	}

	tr.ServiceCIDRsUpdated(nil)
	check("all deleted", nil, nil)
}

func prefixes(t *testing.T, ss ...string) []netip.Prefix {
	t.Helper()
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}
