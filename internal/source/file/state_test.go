package file

// Fixtures: services in namespace demo with cluster IPs in 198.19.0.0/16,
// endpoints in 198.18.0.0/16; node-a is this node.

import (
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/kproxy/kproxy/internal/model"
)

// file is one file's name and content.
type file struct{ name, data string }

// loadFiles does what load does, on files given in memory; prev is the
// state of the previous read, or nil.
func loadFiles(t *testing.T, prev *state, files ...file) loadResult {
	t.Helper()
	res, errs := loadFilesErrs(prev, files...)
	if len(errs) != 0 {
		t.Fatalf("fixture errors: %v", errs)
	}
	return res
}

func loadFilesErrs(prev *state, files ...file) (loadResult, []error) {
	c := newCollector()
	c.prev = prev
	for _, f := range files {
		c.parse(f.name, []byte(f.data))
	}
	return loadResult{state: c.state, objects: c.byKey}, c.errs
}

// TestDeliverDiff checks what a reread delivers, given the files before and
// after.
func TestDeliverDiff(t *testing.T) {
	base := []file{{"state.yaml", docs(nodeDoc("node-a", "1"), svcDoc("web", "2", 80), sliceDoc("web-1", "web", "3"))}}
	for _, tc := range []struct {
		name          string
		before, after []file
		want          []string
	}{{
		name:   "unchanged reread delivers nothing",
		before: base,
		after:  base,
	}, {
		name:   "YAML reformatted: indentation, key order and comments are no change",
		before: []file{{"state.yaml", svcDoc("web", "2", 80)}},
		after: []file{{"state.yaml", "# edited by hand\nkind: Service\napiVersion: v1\nspec:\n    ports:\n    -   port: 80 # http\n    clusterIP: 198.19.0.10\n" +
			"metadata:\n    namespace: demo\n    resourceVersion: \"2\"\n    name: web\n"}},
	}, {
		name:   "a changed service delivers exactly its update",
		before: base,
		after:  []file{{"state.yaml", docs(nodeDoc("node-a", "1"), svcDoc("web", "2", 8080), sliceDoc("web-1", "web", "3"))}},
		want:   []string{"update Service demo/web rv=2"},
	}, {
		name:   "a changed slice delivers exactly its update",
		before: base,
		after:  []file{{"state.yaml", docs(nodeDoc("node-a", "1"), svcDoc("web", "2", 80), sliceDoc("web-1", "web", "4"))}},
		want:   []string{"update EndpointSlice demo/web-1 rv=4"},
	}, {
		name:   "a removed slice delivers its deletion",
		before: base,
		after:  []file{{"state.yaml", docs(nodeDoc("node-a", "1"), svcDoc("web", "2", 80))}},
		want:   []string{"delete EndpointSlice demo/web-1"},
	}, {
		name:   "an object moved to another file with the same text is no change",
		before: []file{{"a.yaml", docs(svcDoc("web", "2", 80), svcDoc("api", "5", 80))}},
		after:  []file{{"a.yaml", svcDoc("api", "5", 80)}, {"b.yaml", svcDoc("web", "2", 80)}},
	}, {
		// The digest is of the text: reformatted JSON is delivered again
		// (harmless, the handler finds the same content).
		name:   "JSON reformatted is delivered as an update",
		before: []file{{"state.json", `{"apiVersion":"v1","kind":"Node","metadata":{"name":"node-a","resourceVersion":"1"}}`}},
		after:  []file{{"state.json", "{\n  \"apiVersion\": \"v1\",\n  \"kind\": \"Node\",\n  \"metadata\": {\"name\": \"node-a\", \"resourceVersion\": \"1\"}\n}\n"}},
		want:   []string{"update Node node-a rv=1"},
	}, {
		name: "order: updates (nodes, services, slices) then deletions (slices, services, nodes), each by key",
		before: []file{{"state.yaml", docs(nodeDoc("node-z", "1"), nodeDoc("node-y", "1"), svcDoc("old-b", "1", 80), svcDoc("old-a", "1", 80),
			sliceDoc("old-b-1", "old-b", "1"), sliceDoc("old-a-1", "old-a", "1"), svcDoc("web", "1", 80))}},
		after: []file{{"state.yaml", docs(sliceDoc("new-b-1", "new-b", "1"), sliceDoc("new-a-1", "new-a", "1"), svcDoc("web", "1", 81),
			svcDoc("new-b", "1", 80), svcDoc("new-a", "1", 80), nodeDoc("node-c", "1"), nodeDoc("node-b", "1"))}},
		want: []string{
			"update Node node-b rv=1", "update Node node-c rv=1",
			"update Service demo/new-a rv=1", "update Service demo/new-b rv=1", "update Service demo/web rv=1",
			"update EndpointSlice demo/new-a-1 rv=1", "update EndpointSlice demo/new-b-1 rv=1",
			"delete EndpointSlice demo/old-a-1", "delete EndpointSlice demo/old-b-1",
			"delete Service demo/old-a", "delete Service demo/old-b",
			"delete Node node-y", "delete Node node-z",
		},
	}} {
		// Run rereads with the current state, so that unchanged objects
		// are not decoded again; without it, everything is decoded.
		for _, withPrev := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/prev=%v", tc.name, withPrev), func(t *testing.T) {
				cur := loadFiles(t, nil, tc.before...).state
				var prev *state
				if withPrev {
					prev = cur
				}
				next := loadFiles(t, prev, tc.after...)
				rec := &recorder{}
				n := deliverDiff(cur, next.state, next.objects, rec)
				if diff := cmp.Diff(tc.want, rec.snapshot(), cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("events (-want +got):\n%s", diff)
				}
				if n != len(rec.snapshot()) {
					t.Errorf("deliverDiff returned %d, delivered %d events", n, len(rec.snapshot()))
				}
				// Every update had its object decoded; with prev, only
				// those were.
				if withPrev && len(next.objects) != countUpdates(rec.snapshot()) {
					t.Errorf("%d objects decoded for %d updates", len(next.objects), countUpdates(rec.snapshot()))
				}
			})
		}
	}
}

func countUpdates(events []string) int {
	n := 0
	for _, e := range events {
		if strings.HasPrefix(e, "update ") {
			n++
		}
	}
	return n
}

// TestRereadUnchanged checks what a reread with the previous state keeps of
// an object it does not decode again.
func TestRereadUnchanged(t *testing.T) {
	web, api := svcDoc("web", "1", 80), svcDoc("api", "1", 80)
	slice := sliceDoc("web-1", "web", "1")
	cur := loadFiles(t, nil, file{"a.yaml", docs(web, api, slice)}).state
	webKey := objectKey{"Service", "demo", "web"}
	sliceKey := objectKey{"EndpointSlice", "demo", "web-1"}

	t.Run("moved to another file: the entry says where it is now", func(t *testing.T) {
		next := loadFiles(t, cur, file{"a.yaml", docs(api, slice)}, file{"b.yaml", web})
		if got := next.state.services[webKey].file; got != "b.yaml" {
			t.Errorf("file of %s is %q, want b.yaml", webKey, got)
		}
		if len(next.objects) != 0 {
			t.Errorf("%d objects decoded, want none", len(next.objects))
		}
	})
	t.Run("the deletion stub survives rereads", func(t *testing.T) {
		next := loadFiles(t, cur, file{"a.yaml", docs(web, api, slice)})
		e := next.state.slices[sliceKey]
		stub := sliceStub(sliceKey, e)
		if stub.AddressType != discovery.AddressTypeIPv4 || stub.Labels[discovery.LabelServiceName] != "web" || stub.Name != "web-1" || stub.Namespace != "demo" {
			t.Errorf("deletion stub of %s after a reread: %s/%s addressType %q labels %v", sliceKey, stub.Namespace, stub.Name, stub.AddressType, stub.Labels)
		}
	})
	t.Run("a duplicate of an unchanged object is still reported", func(t *testing.T) {
		next, errs := loadFilesErrs(cur, file{"a.yaml", docs(web, api, slice)}, file{"b.yaml", web})
		var de *DocumentError
		if len(errs) != 1 || !errors.As(errs[0], &de) || de.File != "b.yaml" || !strings.Contains(de.Err.Error(), "duplicate Service demo/web") {
			t.Fatalf("errors %v, want one duplicate of Service demo/web in b.yaml", errs)
		}
		if got := next.state.services[webKey].file; got != "a.yaml" {
			t.Errorf("file of %s is %q, want a.yaml (the first one read)", webKey, got)
		}
	})
	t.Run("the same text under another name is decoded", func(t *testing.T) {
		// Same digest as cur's web, but not the same key.
		next := loadFiles(t, cur, file{"a.yaml", docs(svcDoc("web2", "1", 80), api, slice)})
		if _, ok := next.objects[objectKey{"Service", "demo", "web2"}]; !ok || len(next.objects) != 1 {
			t.Errorf("decoded %v, want only demo/web2", slices.Collect(maps.Keys(next.objects)))
		}
	})
}

// deletedSlices records the EndpointSlices given to EndpointSliceDeleted.
type deletedSlices struct {
	discard
	got []*discovery.EndpointSlice
}

func (d *deletedSlices) EndpointSliceDeleted(s *discovery.EndpointSlice) { d.got = append(d.got, s) }

// TestDeletedSliceStub: a deleted slice is given as a stub that holds what
// a handler needs to find the slice's Service again.
func TestDeletedSliceStub(t *testing.T) {
	slice := "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-v6\n  namespace: demo\n" +
		"  labels:\n    kubernetes.io/service-name: web\n    team: blue\naddressType: IPv6\nendpoints:\n- addresses: [\"2001:db8::10\"]\n"
	cur := loadFiles(t, nil, file{"state.yaml", slice}).state
	next := loadFiles(t, cur)
	h := &deletedSlices{}
	deliverDiff(cur, next.state, next.objects, h)
	if len(h.got) != 1 {
		t.Fatalf("got %d deleted slices, want 1", len(h.got))
	}
	s := h.got[0]
	if s.Namespace != "demo" || s.Name != "web-v6" || s.AddressType != discovery.AddressTypeIPv6 {
		t.Errorf("stub is %s/%s addressType %q, want demo/web-v6 IPv6", s.Namespace, s.Name, s.AddressType)
	}
	// Only the label that names the Service: the others are not kept.
	if diff := cmp.Diff(map[string]string{discovery.LabelServiceName: "web"}, s.Labels); diff != "" {
		t.Errorf("stub labels (-want +got):\n%s", diff)
	}
}

// TestDeletionsReachTracker runs deletions through a real model.Tracker:
// what it was given must be enough for it to drop the endpoints, the
// service and the node.
func TestDeletionsReachTracker(t *testing.T) {
	slice := sliceDoc("web-1", "web", "3") + "ports:\n- name: http\n  port: 8080\n  protocol: TCP\n"
	svc := "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: demo\nspec:\n  clusterIP: 198.19.0.10\n" +
		"  ports:\n  - name: http\n    port: 80\n    protocol: TCP\n"
	node := "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-a\nstatus:\n  addresses:\n  - type: InternalIP\n    address: 198.17.0.10\n"

	tr := model.NewTracker(model.TrackerOptions{Hostname: "node-a", Families: []v1.IPFamily{v1.IPv4Protocol}})
	first := loadFiles(t, nil, file{"state.yaml", docs(node, svc, slice)})
	// As Run does at start: everything is an update.
	deliverDiff(newState(), first.state, first.objects, tr)
	u := tr.Take()
	d := u.Families[v1.IPv4Protocol]
	spn := model.ServicePortName{Port: "http", Protocol: v1.ProtocolTCP}
	spn.Namespace, spn.Name = "demo", "web"
	if len(d.Endpoints[spn]) != 1 || d.Services[spn] == nil || u.Node == nil {
		t.Fatalf("first update: endpoints %v, service %v, node %v; want one endpoint, the service and the node", d.Endpoints, d.Services, u.Node)
	}

	// The slice goes first: the service stays, its endpoints go.
	second := loadFiles(t, first.state, file{"state.yaml", docs(node, svc)})
	if n := deliverDiff(first.state, second.state, second.objects, tr); n != 1 {
		t.Fatalf("slice removed: %d events, want 1", n)
	}
	d = tr.Take().Families[v1.IPv4Protocol]
	if eps, ok := d.Endpoints[spn]; !ok || eps != nil {
		t.Errorf("slice removed: endpoints of %s are %v (present %v), want a deletion (nil)", spn, eps, ok)
	}
	if len(d.Services) != 0 {
		t.Errorf("slice removed: services changed: %v", d.Services)
	}

	// Then the service and the node.
	third := loadFiles(t, second.state)
	if n := deliverDiff(second.state, third.state, third.objects, tr); n != 2 {
		t.Fatalf("service and node removed: %d events, want 2", n)
	}
	u = tr.Take()
	if sp, ok := u.Families[v1.IPv4Protocol].Services[spn]; !ok || sp != nil {
		t.Errorf("service removed: %s is %v (present %v), want a deletion (nil)", spn, sp, ok)
	}
	if !u.NodeDeleted {
		t.Error("node removed: the tracker did not see the deletion")
	}
}

// TestStateDropsObjects: once the handler has them, the decoded objects are
// not kept by the source (a handler that keeps nothing lets them all be
// collected).
func TestStateDropsObjects(t *testing.T) {
	path := writeSnapshot(t, 200)
	objs, _, res := load(path, fileOptions, nil)
	var live atomic.Int64
	track := func(p any) {
		live.Add(1)
		switch o := p.(type) {
		case *v1.Service:
			runtime.AddCleanup(o, func(int) { live.Add(-1) }, 0)
		case *v1.Node:
			runtime.AddCleanup(o, func(int) { live.Add(-1) }, 0)
		case *discovery.EndpointSlice:
			runtime.AddCleanup(o, func(int) { live.Add(-1) }, 0)
		}
	}
	for _, o := range res.objects {
		track(o)
	}
	if got := live.Load(); got != 401 {
		t.Fatalf("tracking %d objects, want 401", got)
	}
	objs.Feed(&discard{})
	st := res.state
	objs, res = nil, loadResult{}

	// Cleanups run after the collection that finds an object unreachable,
	// on their own goroutine: collect until they have or time is up.
	deadline := time.Now().Add(10 * time.Second)
	for live.Load() > 0 && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if n := live.Load(); n != 0 {
		t.Errorf("%d of 401 decoded objects still reachable after they were delivered", n)
	}
	if len(st.services) != 200 || len(st.slices) != 200 || len(st.nodes) != 1 {
		t.Errorf("state has %d services, %d slices, %d nodes; want 200, 200, 1", len(st.services), len(st.slices), len(st.nodes))
	}
}
