package apiserver

// Addresses used in these tests:
//   198.18.0.10, 198.18.0.11     node-a, node-b (node IPs)
//   198.18.129.0/24              pods on node-a
//   198.18.130.0/24              pods on node-b
//   198.19.0.0/16                service cluster IPs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networking "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/internal/model"
)

const (
	hostname = "node-a"
	waitFor  = 10 * time.Second
)

// event is one call seen by the recorder, e.g. {"update", "Service", "demo/web"}.
type event struct {
	Op, Kind, Key string
}

func (e event) String() string { return e.Op + " " + e.Kind + " " + e.Key }

// recorder is an EventHandler that records every call and forwards it to
// next (a real Tracker), so tests check both what arrives and what the
// model makes of it.
type recorder struct {
	next model.EventHandler

	mu         sync.Mutex
	events     []event
	concurrent bool
	inCall     bool
}

func (r *recorder) record(op, kind, key string, forward func()) {
	r.mu.Lock()
	if r.inCall {
		r.concurrent = true
	}
	r.inCall = true
	r.mu.Unlock()
	forward()
	// Recorded only once the handler has returned, so a test that saw
	// the event also sees what the Tracker made of it.
	r.mu.Lock()
	r.events = append(r.events, event{op, kind, key})
	r.inCall = false
	r.mu.Unlock()
}

func key(m metav1.Object) string {
	if m.GetNamespace() == "" {
		return m.GetName()
	}
	return m.GetNamespace() + "/" + m.GetName()
}

func (r *recorder) ServiceUpdated(s *v1.Service) {
	r.record("update", "Service", key(s), func() { r.next.ServiceUpdated(s) })
}
func (r *recorder) ServiceDeleted(s *v1.Service) {
	r.record("delete", "Service", key(s), func() { r.next.ServiceDeleted(s) })
}
func (r *recorder) EndpointSliceUpdated(s *discovery.EndpointSlice) {
	r.record("update", "EndpointSlice", key(s), func() { r.next.EndpointSliceUpdated(s) })
}
func (r *recorder) EndpointSliceDeleted(s *discovery.EndpointSlice) {
	r.record("delete", "EndpointSlice", key(s), func() { r.next.EndpointSliceDeleted(s) })
}
func (r *recorder) NodeUpdated(n *v1.Node) {
	r.record("update", "Node", key(n), func() { r.next.NodeUpdated(n) })
}
func (r *recorder) NodeDeleted(n *v1.Node) {
	r.record("delete", "Node", key(n), func() { r.next.NodeDeleted(n) })
}
func (r *recorder) ServiceCIDRsUpdated(all []*networking.ServiceCIDR) {
	var cidrs []string
	for _, o := range all {
		cidrs = append(cidrs, o.Spec.CIDRs...)
	}
	slices.Sort(cidrs)
	r.record("update", "ServiceCIDRs", strings.Join(cidrs, ","), func() { r.next.ServiceCIDRsUpdated(all) })
}
func (r *recorder) Synced() { r.record("synced", "", "", r.next.Synced) }

func (r *recorder) snapshot() []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// waitEvents waits until the recorder has at least n events and returns them.
func (r *recorder) waitEvents(t *testing.T, n int) []event {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		ev := r.snapshot()
		if len(ev) >= n {
			return ev
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %d events, have %d: %v", n, len(ev), ev)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// --- fixtures ---

func makeService(ns, name string, tweak func(*v1.Service)) *v1.Service {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  "198.19.0.10",
			ClusterIPs: []string{"198.19.0.10"},
			Ports: []v1.ServicePort{{
				Name: "http", Port: 80, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromInt32(8080),
			}},
		},
	}
	if tweak != nil {
		tweak(svc)
	}
	return svc
}

func makeSlice(ns, name, service string, tweak func(*discovery.EndpointSlice)) *discovery.EndpointSlice {
	s := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name,
			Labels: map[string]string{discovery.LabelServiceName: service},
		},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
		Endpoints: []discovery.Endpoint{
			{Addresses: []string{"198.18.129.10"}, Conditions: discovery.EndpointConditions{Ready: ptr.To(true)}, NodeName: ptr.To("node-a")},
			{Addresses: []string{"198.18.130.10"}, Conditions: discovery.EndpointConditions{Ready: ptr.To(true)}, NodeName: ptr.To("node-b")},
		},
	}
	if tweak != nil {
		tweak(s)
	}
	return s
}

func makeNode(name, ip string, tweak func(*v1.Node)) *v1.Node {
	n := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1.LabelHostname: name}},
		Status:     v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: ip}}},
	}
	if tweak != nil {
		tweak(n)
	}
	return n
}

// initialObjects: one proxied service with a slice, this node, and objects
// that must never be delivered: another node, a headless service with its
// slice, and a service (and slice) handed to another proxy.
func initialObjects() []runtime.Object {
	return []runtime.Object{
		makeNode("node-a", "198.18.0.10", nil),
		makeNode("node-b", "198.18.0.11", nil),
		makeService("demo", "web", nil),
		makeSlice("demo", "web-abcde", "web", nil),
		makeService("demo", "headless", func(s *v1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = v1.ClusterIPNone, []string{v1.ClusterIPNone}
		}),
		makeSlice("demo", "headless-fghij", "headless", func(s *discovery.EndpointSlice) {
			s.Labels[model.LabelHeadless] = ""
		}),
		makeService("demo", "other-proxy", func(s *v1.Service) {
			s.Labels = map[string]string{model.LabelServiceProxyName: "other"}
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "198.19.0.11", []string{"198.19.0.11"}
		}),
		// Left out by the API server's selector; the fake clientset
		// ignores selectors, so the source's own check drops it.
		makeSlice("demo", "other-proxy-klmno", "other-proxy", func(s *discovery.EndpointSlice) {
			s.Labels[model.LabelServiceProxyName] = "other"
		}),
	}
}

type harness struct {
	client  *fake.Clientset
	rec     *recorder
	tracker *model.Tracker
	cancel  context.CancelFunc
	done    chan error
}

func start(t *testing.T, client *fake.Clientset) *harness {
	t.Helper()
	tr := model.NewTracker(model.TrackerOptions{Hostname: hostname, Families: []v1.IPFamily{model.IPv4}})
	h := &harness{client: client, rec: &recorder{next: tr}, tracker: tr, done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.done <- New(client, hostname, 0).Run(ctx, h.rec) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-h.done:
		case <-time.After(waitFor):
			t.Errorf("Run did not return after cancel")
		}
	})
	return h
}

func sortEvents(ev []event) []event {
	out := slices.Clone(ev)
	slices.SortFunc(out, func(a, b event) int { return strings.Compare(a.String(), b.String()) })
	return out
}

var (
	webHTTP = model.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "demo", Name: "web"}, Port: "http", Protocol: v1.ProtocolTCP}
	bg      = context.Background()
)

// TestInitialSyncThenChanges drives one source through its whole life: the
// initial state, then an add/update/delete of each kind, checking both the
// events and what a real Tracker makes of them.
func TestInitialSyncThenChanges(t *testing.T) {
	client := fake.NewClientset(initialObjects()...)
	h := start(t, client)

	ev := h.rec.waitEvents(t, 4)
	wantInitial := []event{
		{"update", "EndpointSlice", "demo/web-abcde"},
		{"update", "Node", "node-a"},
		{"update", "Service", "demo/web"},
	}
	if diff := cmp.Diff(wantInitial, sortEvents(ev[:3])); diff != "" {
		t.Errorf("initial events (-want +got):\n%s", diff)
	}
	if ev[3] != (event{"synced", "", ""}) {
		t.Errorf("4th event = %v, want synced after the initial objects", ev[3])
	}
	if !h.tracker.HasSynced() {
		t.Errorf("tracker not synced")
	}
	u := h.tracker.Take()
	v4 := u.Families[model.IPv4]
	if sp := v4.Services[webHTTP]; sp == nil || sp.ClusterIP != netip.MustParseAddr("198.19.0.10") || sp.Port != 80 {
		t.Errorf("web:http after sync = %+v, want 198.19.0.10:80", sp)
	}
	if len(v4.Services) != 1 || len(v4.Endpoints) != 1 {
		t.Errorf("after sync: services %v, endpoints %v; want only demo/web's (headless and other-proxy skipped)", v4.Services, v4.Endpoints)
	}
	if got := endpointStrings(v4.Endpoints[webHTTP]); !slices.Equal(got, []string{"198.18.129.10:8080 local", "198.18.130.10:8080"}) {
		t.Errorf("web:http endpoints = %v", got)
	}
	if u.Node == nil || u.Node.Name != hostname {
		t.Errorf("node after sync = %+v, want %s", u.Node, hostname)
	}

	// Each step changes the cluster and says which events must follow
	// and what the next Take must show.
	steps := []struct {
		name   string
		do     func() error
		events []event
		check  func(t *testing.T, u *model.Update)
	}{{
		name: "service updated",
		do: func() error {
			_, err := client.CoreV1().Services("demo").Update(bg, makeService("demo", "web", func(s *v1.Service) {
				s.Spec.Ports[0].Port = 8000
			}), metav1.UpdateOptions{})
			return err
		},
		events: []event{{"update", "Service", "demo/web"}},
		check: func(t *testing.T, u *model.Update) {
			if sp := u.Families[model.IPv4].Services[webHTTP]; sp == nil || sp.Port != 8000 {
				t.Errorf("web:http = %+v, want port 8000", sp)
			}
		},
	}, {
		name: "service added",
		do: func() error {
			_, err := client.CoreV1().Services("demo").Create(bg, makeService("demo", "api", func(s *v1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = "198.19.0.12", []string{"198.19.0.12"}
			}), metav1.CreateOptions{})
			return err
		},
		events: []event{{"update", "Service", "demo/api"}},
		check: func(t *testing.T, u *model.Update) {
			name := webHTTP
			name.Name = "api"
			if sp := u.Families[model.IPv4].Services[name]; sp == nil || sp.ClusterIP != netip.MustParseAddr("198.19.0.12") {
				t.Errorf("api:http = %+v, want cluster IP 198.19.0.12", sp)
			}
		},
	}, {
		name: "slice updated",
		do: func() error {
			_, err := client.DiscoveryV1().EndpointSlices("demo").Update(bg, makeSlice("demo", "web-abcde", "web", func(s *discovery.EndpointSlice) {
				s.Endpoints = s.Endpoints[1:]
			}), metav1.UpdateOptions{})
			return err
		},
		events: []event{{"update", "EndpointSlice", "demo/web-abcde"}},
		check: func(t *testing.T, u *model.Update) {
			if got := endpointStrings(u.Families[model.IPv4].Endpoints[webHTTP]); !slices.Equal(got, []string{"198.18.130.10:8080"}) {
				t.Errorf("web:http endpoints = %v", got)
			}
		},
	}, {
		name: "slice added",
		do: func() error {
			_, err := client.DiscoveryV1().EndpointSlices("demo").Create(bg, makeSlice("demo", "web-klmno", "web", func(s *discovery.EndpointSlice) {
				s.Endpoints = []discovery.Endpoint{{Addresses: []string{"198.18.129.11"}, NodeName: ptr.To("node-a")}}
			}), metav1.CreateOptions{})
			return err
		},
		events: []event{{"update", "EndpointSlice", "demo/web-klmno"}},
		check: func(t *testing.T, u *model.Update) {
			if got := endpointStrings(u.Families[model.IPv4].Endpoints[webHTTP]); !slices.Equal(got, []string{"198.18.129.11:8080 local", "198.18.130.10:8080"}) {
				t.Errorf("web:http endpoints = %v", got)
			}
		},
	}, {
		name: "slices deleted",
		do: func() error {
			return errors.Join(
				client.DiscoveryV1().EndpointSlices("demo").Delete(bg, "web-abcde", metav1.DeleteOptions{}),
				client.DiscoveryV1().EndpointSlices("demo").Delete(bg, "web-klmno", metav1.DeleteOptions{}))
		},
		events: []event{{"delete", "EndpointSlice", "demo/web-abcde"}, {"delete", "EndpointSlice", "demo/web-klmno"}},
		check: func(t *testing.T, u *model.Update) {
			eps, ok := u.Families[model.IPv4].Endpoints[webHTTP]
			if !ok || eps != nil {
				t.Errorf("web:http endpoints = %v (present %v), want a nil entry (no endpoints)", eps, ok)
			}
		},
	}, {
		name: "service deleted",
		do: func() error {
			return client.CoreV1().Services("demo").Delete(bg, "web", metav1.DeleteOptions{})
		},
		events: []event{{"delete", "Service", "demo/web"}},
		check: func(t *testing.T, u *model.Update) {
			sp, ok := u.Families[model.IPv4].Services[webHTTP]
			if !ok || sp != nil {
				t.Errorf("web:http = %+v (present %v), want a nil entry (deleted)", sp, ok)
			}
		},
	}, {
		// Before the API server filters it out, a service that gains the
		// proxy-name label is seen as deleted.
		name: "service handed to another proxy",
		do: func() error {
			_, err := client.CoreV1().Services("demo").Update(bg, makeService("demo", "api", func(s *v1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = "198.19.0.12", []string{"198.19.0.12"}
				s.Labels = map[string]string{model.LabelServiceProxyName: "other"}
			}), metav1.UpdateOptions{})
			return err
		},
		events: []event{{"delete", "Service", "demo/api"}},
		check: func(t *testing.T, u *model.Update) {
			name := webHTTP
			name.Name = "api"
			if sp, ok := u.Families[model.IPv4].Services[name]; !ok || sp != nil {
				t.Errorf("api:http = %+v (present %v), want a nil entry", sp, ok)
			}
		},
	}, {
		// node-b's update comes first on the same watch: had it been
		// delivered, it would be recorded before node-a's.
		name: "nodes updated, only this one delivered",
		do: func() error {
			_, err1 := client.CoreV1().Nodes().Update(bg, makeNode("node-b", "198.18.0.11", func(n *v1.Node) {
				n.Labels[v1.LabelTopologyZone] = "zone-b"
			}), metav1.UpdateOptions{})
			_, err2 := client.CoreV1().Nodes().Update(bg, makeNode("node-a", "198.18.0.10", func(n *v1.Node) {
				n.Labels[v1.LabelTopologyZone] = "zone-a"
			}), metav1.UpdateOptions{})
			return errors.Join(err1, err2)
		},
		events: []event{{"update", "Node", "node-a"}},
		check: func(t *testing.T, u *model.Update) {
			if u.Node.Zone() != "zone-a" {
				t.Errorf("node zone = %q, want zone-a", u.Node.Zone())
			}
		},
	}, {
		name: "nodes deleted, only this one delivered",
		do: func() error {
			return errors.Join(
				client.CoreV1().Nodes().Delete(bg, "node-b", metav1.DeleteOptions{}),
				client.CoreV1().Nodes().Delete(bg, "node-a", metav1.DeleteOptions{}))
		},
		events: []event{{"delete", "Node", "node-a"}},
		check: func(t *testing.T, u *model.Update) {
			if !u.NodeDeleted || u.Node != nil {
				t.Errorf("NodeDeleted = %v, Node = %+v; want deleted", u.NodeDeleted, u.Node)
			}
		},
	}}
	seen := len(h.rec.snapshot())
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if err := st.do(); err != nil {
				t.Fatal(err)
			}
			ev := h.rec.waitEvents(t, seen+len(st.events))
			if diff := cmp.Diff(sortEvents(st.events), sortEvents(ev[seen:])); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
			seen = len(ev)
			st.check(t, h.tracker.Take())
		})
	}

	// After Run returns, nothing more is delivered.
	h.cancel()
	select {
	case err := <-h.done:
		if err != nil {
			t.Errorf("Run returned %v after cancel, want nil", err)
		}
	case <-time.After(waitFor):
		t.Fatal("Run did not return after cancel")
	}
	h.done <- nil // for the cleanup
	before := len(h.rec.snapshot())
	if _, err := client.CoreV1().Services("demo").Create(bg, makeService("demo", "late", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if ev := h.rec.snapshot(); len(ev) != before {
		t.Errorf("events after Run returned: %v", ev[before:])
	}
	h.rec.mu.Lock()
	if h.rec.concurrent {
		t.Errorf("handler was called concurrently")
	}
	h.rec.mu.Unlock()
}

func endpointStrings(eps []*model.Endpoint) []string {
	var out []string
	for _, e := range eps {
		s := e.String()
		if e.Local {
			s += " local"
		}
		out = append(out, s)
	}
	return out
}

// TestSelectors checks that the API server is asked for what upstream asks
// for, so filtering happens there and not only on our side.
func TestSelectors(t *testing.T) {
	client := fake.NewClientset(initialObjects()...)
	h := start(t, client)
	h.rec.waitEvents(t, 4)

	want := map[string]string{
		"services": `labels="!service.kubernetes.io/service-proxy-name" fields="spec.clusterIP!=None"`,
		// Slices of another proxy's services are left out by the API
		// server too (upstream's tracker drops them after receiving them).
		"endpointslices": `labels="!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name" fields=""`,
		"nodes":          `labels="" fields="metadata.name=node-a"`,
		// All of them, as upstream (Synced does not wait for them, so
		// their list may come a little later).
		"servicecidrs": `labels="" fields=""`,
	}
	got := map[string]string{}
	for deadline := time.Now().Add(waitFor); len(got) < len(want) && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		for _, a := range client.Actions() {
			l, ok := a.(k8stesting.ListActionImpl)
			if !ok {
				continue
			}
			r := l.GetListRestrictions()
			got[l.GetResource().Resource] = fmt.Sprintf("labels=%q fields=%q", r.Labels.String(), r.Fields.String())
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("list selectors (-want +got):\n%s", diff)
	}
}

// TestNoSyncedBeforeAllInformersSynced holds back the EndpointSlice list:
// services and the node arrive, but Synced must wait for the slices.
func TestNoSyncedBeforeAllInformersSynced(t *testing.T) {
	client := fake.NewClientset(initialObjects()...)
	// The fake holds a lock while a reactor runs, so the list is failed
	// (the reflector retries with backoff) rather than blocked.
	var held atomic.Bool
	held.Store(true)
	client.PrependReactor("list", "endpointslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		if held.Load() {
			return true, nil, errors.New("held back by the test")
		}
		return false, nil, nil // fall through to the object tracker
	})
	h := start(t, client)

	h.rec.waitEvents(t, 2) // the service and the node
	time.Sleep(300 * time.Millisecond)
	for _, e := range h.rec.snapshot() {
		if e.Op == "synced" || e.Kind == "EndpointSlice" {
			t.Fatalf("got %v while the EndpointSlice list was held back", e)
		}
	}
	if h.tracker.HasSynced() {
		t.Fatal("tracker synced while the EndpointSlice list was held back")
	}
	held.Store(false)
	ev := h.rec.waitEvents(t, 4)
	wantSlices := []event{{"update", "EndpointSlice", "demo/web-abcde"}}
	if !cmp.Equal(ev[2:3], wantSlices) || ev[3] != (event{"synced", "", ""}) {
		t.Errorf("events after release = %v, want the slices then synced", ev[2:])
	}
}

// TestCancelBeforeSync: a Run that never syncs returns an error and never
// calls Synced.
func TestCancelBeforeSync(t *testing.T) {
	client := fake.NewClientset(initialObjects()...)
	client.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("injected list failure")
	})
	rec := &recorder{next: model.NewTracker(model.TrackerOptions{Hostname: hostname})}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := New(client, hostname, 0).Run(ctx, rec)
	if err == nil {
		t.Fatal("Run returned nil, want an error: the node informer never synced")
	}
	for _, e := range rec.snapshot() {
		if e.Op == "synced" {
			t.Errorf("Synced called although the node list always failed")
		}
	}
}

func TestEmptyHostname(t *testing.T) {
	err := New(fake.NewClientset(), "", 0).Run(context.Background(), &recorder{})
	if err == nil {
		t.Fatal("Run with an empty hostname returned nil")
	}
}

// TestHandlerFuncs covers what a fake watch cannot easily produce: deletion
// tombstones, foreign objects, and objects that stop or start matching.
func TestHandlerFuncs(t *testing.T) {
	web := makeService("demo", "web", nil)
	other := makeService("demo", "web", func(s *v1.Service) {
		s.Labels = map[string]string{model.LabelServiceProxyName: "x"}
	})
	tests := []struct {
		name string
		call func(cache.ResourceEventHandlerFuncs)
		want []string
	}{
		{"add", func(f cache.ResourceEventHandlerFuncs) { f.OnAdd(web, true) }, []string{"updated demo/web"}},
		{"add unwanted", func(f cache.ResourceEventHandlerFuncs) { f.OnAdd(other, true) }, nil},
		{"add wrong type", func(f cache.ResourceEventHandlerFuncs) { f.OnAdd(makeNode("n", "198.18.0.10", nil), true) }, nil},
		{"update", func(f cache.ResourceEventHandlerFuncs) { f.OnUpdate(web, web) }, []string{"updated demo/web"}},
		{"update to unwanted", func(f cache.ResourceEventHandlerFuncs) { f.OnUpdate(web, other) }, []string{"deleted demo/web"}},
		{"update from unwanted", func(f cache.ResourceEventHandlerFuncs) { f.OnUpdate(other, web) }, []string{"updated demo/web"}},
		{"update unwanted", func(f cache.ResourceEventHandlerFuncs) { f.OnUpdate(other, other) }, nil},
		{"delete", func(f cache.ResourceEventHandlerFuncs) { f.OnDelete(web) }, []string{"deleted demo/web"}},
		{"delete tombstone", func(f cache.ResourceEventHandlerFuncs) {
			f.OnDelete(cache.DeletedFinalStateUnknown{Key: "demo/web", Obj: web})
		}, []string{"deleted demo/web"}},
		{"delete tombstone of unwanted", func(f cache.ResourceEventHandlerFuncs) {
			f.OnDelete(cache.DeletedFinalStateUnknown{Key: "demo/web", Obj: other})
		}, nil},
		{"delete tombstone of wrong type", func(f cache.ResourceEventHandlerFuncs) {
			f.OnDelete(cache.DeletedFinalStateUnknown{Key: "demo/web", Obj: "junk"})
		}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			f := handlerFuncs(wantService,
				func(s *v1.Service) { got = append(got, "updated "+key(s)) },
				func(s *v1.Service) { got = append(got, "deleted "+key(s)) })
			tc.call(f)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("calls (-want +got):\n%s", diff)
			}
		})
	}
}

func TestWant(t *testing.T) {
	s := &apiSource{hostname: "node-a"}
	tests := []struct {
		name string
		got  bool
		want bool
	}{
		{"plain service", wantService(makeService("demo", "a", nil)), true},
		{"headless service", wantService(makeService("demo", "a", func(s *v1.Service) { s.Spec.ClusterIP = v1.ClusterIPNone })), false},
		{"other proxy's service", wantService(makeService("demo", "a", func(s *v1.Service) {
			s.Labels = map[string]string{model.LabelServiceProxyName: ""}
		})), false},
		{"plain slice", wantSlice(makeSlice("demo", "a-1", "a", nil)), true},
		{"headless slice", wantSlice(makeSlice("demo", "a-1", "a", func(s *discovery.EndpointSlice) { s.Labels[model.LabelHeadless] = "" })), false},
		{"other proxy's slice", wantSlice(makeSlice("demo", "a-1", "a", func(s *discovery.EndpointSlice) { s.Labels[model.LabelServiceProxyName] = "x" })), false},
		{"this node", s.wantNode(makeNode("node-a", "198.18.0.10", nil)), true},
		{"other node", s.wantNode(makeNode("node-b", "198.18.0.11", nil)), false},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("%s: want = %v, expected %v", tc.name, tc.got, tc.want)
		}
	}
}
