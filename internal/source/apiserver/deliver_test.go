package apiserver

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kproxy/kproxy/internal/model"
)

// TestDeliveringStore: what a reflector's calls deliver, including what a
// fake watch cannot easily produce (a relist that no longer holds an
// object, deletion tombstones, objects that stop or start matching).
func TestDeliveringStore(t *testing.T) {
	web := makeService("demo", "web", nil)
	db := makeService("demo", "db", nil)
	other := makeService("demo", "web", func(s *v1.Service) {
		s.Labels = map[string]string{model.LabelServiceProxyName: "x"}
	})
	tests := []struct {
		name    string
		calls   func(s cache.ReflectorStore) error
		want    []string
		wantErr string
		// known is how many objects the store remembers afterwards.
		known int
	}{
		{"add", func(s cache.ReflectorStore) error { return s.Add(web) }, []string{"updated demo/web"}, "", 1},
		{"add unwanted", func(s cache.ReflectorStore) error { return s.Add(other) }, nil, "", 0},
		{"add wrong type", func(s cache.ReflectorStore) error { return s.Add(makeNode("n", "198.18.0.10", nil)) }, nil, "unexpected object of type *v1.Node", 0},
		{"update", func(s cache.ReflectorStore) error { return s.Update(web) }, []string{"updated demo/web"}, "", 1},
		{"update to unwanted", func(s cache.ReflectorStore) error {
			_ = s.Add(web)
			return s.Update(other)
		}, []string{"updated demo/web", "deleted demo/web"}, "", 0},
		{"update unwanted, never delivered", func(s cache.ReflectorStore) error { return s.Update(other) }, nil, "", 0},
		{"update from unwanted", func(s cache.ReflectorStore) error {
			_ = s.Add(other)
			return s.Update(web)
		}, []string{"updated demo/web"}, "", 1},
		{"delete", func(s cache.ReflectorStore) error {
			_ = s.Add(web)
			return s.Delete(web)
		}, []string{"updated demo/web", "deleted demo/web"}, "", 0},
		{"delete twice", func(s cache.ReflectorStore) error {
			_ = s.Add(web)
			_ = s.Delete(web)
			return s.Delete(web)
		}, []string{"updated demo/web", "deleted demo/web"}, "", 0},
		{"delete never delivered", func(s cache.ReflectorStore) error { return s.Delete(other) }, nil, "", 0},
		{"delete tombstone", func(s cache.ReflectorStore) error {
			_ = s.Add(web)
			return s.Delete(cache.DeletedFinalStateUnknown{Key: "demo/web", Obj: web})
		}, []string{"updated demo/web", "deleted demo/web"}, "", 0},
		{"relist", func(s cache.ReflectorStore) error {
			_ = s.Add(web)
			_ = s.Add(db)
			return s.Replace([]any{db}, "2")
		}, []string{"updated demo/web", "updated demo/db", "updated demo/db", "deleted demo/web"}, "", 1},
		{"relist with the same objects", func(s cache.ReflectorStore) error {
			_ = s.Replace([]any{web, db}, "1")
			return s.Replace([]any{db, web}, "2")
		}, []string{"updated demo/web", "updated demo/db", "updated demo/db", "updated demo/web"}, "", 2},
		{"relist with one now unwanted", func(s cache.ReflectorStore) error {
			_ = s.Replace([]any{web}, "1")
			return s.Replace([]any{other}, "2")
		}, []string{"updated demo/web", "deleted demo/web"}, "", 0},
		{"relist with junk", func(s cache.ReflectorStore) error { return s.Replace([]any{"junk", web}, "1") },
			[]string{"updated demo/web"}, "", 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			s := newServiceStore(
				func(s *v1.Service) { got = append(got, "updated "+key(s)) },
				func(s *v1.Service) { got = append(got, "deleted "+key(s)) })
			err := tc.calls(s)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("calls (-want +got):\n%s", diff)
			}
			if (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %v, want %q", err, tc.wantErr)
			}
			if len(s.known) != tc.known {
				t.Errorf("remembers %v, want %d objects", s.known, tc.known)
			}
		})
	}
}

// TestDeliveringStoreSynced: synced once the first list is delivered, not
// before, even when watch events came first; the source's wait
// (cache.WaitFor on the store's Done channel) ends then, without polling.
func TestDeliveringStoreSynced(t *testing.T) {
	s := newServiceStore(func(*v1.Service) {}, func(*v1.Service) {})
	_ = s.Add(makeService("demo", "web", nil))
	if s.hasSynced() || cache.IsDone(s) {
		t.Fatal("synced before any list")
	}
	waited := make(chan bool)
	go func() { waited <- cache.WaitFor(context.Background(), "", s) }()
	_ = s.Replace(nil, "1")
	if !s.hasSynced() {
		t.Fatal("not synced after the first list")
	}
	select {
	case ok := <-waited:
		if !ok {
			t.Fatal("WaitFor: not done")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitFor did not end with the first list")
	}
	// A relist leaves it synced (and closes nothing twice).
	_ = s.Replace(nil, "2")
	if !cache.IsDone(s) {
		t.Fatal("not synced after a relist")
	}
}

// TestDeliveringStoreSliceTomb: a slice a relist no longer holds is
// delivered deleted with what the Tracker finds it by, so its endpoints
// go, in both families; the Tracker is the real one.
func TestDeliveringStoreSliceTomb(t *testing.T) {
	tr := model.NewTracker(model.TrackerOptions{Hostname: hostname, Families: []v1.IPFamily{model.IPv4, model.IPv6}})
	tr.ServiceUpdated(makeService("demo", "web", func(s *v1.Service) {
		s.Spec.ClusterIPs = []string{"198.19.0.10", "fd00:19::10"}
		s.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
	}))
	v4 := makeSlice("demo", "web-4", "web", nil)
	v6 := makeSlice("demo", "web-6", "web", func(s *discovery.EndpointSlice) {
		s.AddressType = discovery.AddressTypeIPv6
		s.Endpoints[0].Addresses = []string{"fd00:18:129::10"}
		s.Endpoints[1].Addresses = []string{"fd00:18:130::10"}
	})
	s := newSliceStore(tr.EndpointSliceUpdated, tr.EndpointSliceDeleted)
	if err := s.Replace([]any{v4, v6}, "1"); err != nil {
		t.Fatal(err)
	}
	tr.Synced()
	u := tr.Take()
	for _, fam := range []v1.IPFamily{model.IPv4, model.IPv6} {
		if n := len(u.Families[fam].Endpoints[webHTTP]); n != 2 {
			t.Fatalf("%s: %d endpoints after the first list, want 2", fam, n)
		}
	}
	if err := s.Replace(nil, "2"); err != nil {
		t.Fatal(err)
	}
	u = tr.Take()
	for _, fam := range []v1.IPFamily{model.IPv4, model.IPv6} {
		d := u.Families[fam]
		if d == nil {
			t.Fatalf("%s: no change after the slices went", fam)
		}
		if eps, ok := d.Endpoints[webHTTP]; !ok || len(eps) != 0 {
			t.Errorf("%s: endpoints after the slices went = %v (present %v), want none", fam, endpointStrings(eps), ok)
		}
	}
	if len(s.known) != 0 {
		t.Errorf("known after the relist: %v", s.known)
	}
}
