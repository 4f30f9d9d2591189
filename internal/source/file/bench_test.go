package file

// The snapshot generated here has the shape of test/bench's: a kubectl List
// in JSON with node-a, N Services (198.19.0.0/16 cluster IPs, port 80) and
// one EndpointSlice of 10 endpoints (198.18.0.0/16, on node-b) per Service.

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networking "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/internal/model"
)

const benchEndpointsPerService = 10

// benchAddr returns prefix.x.y for the i-th address of a /16.
func benchAddr(prefix [2]byte, i int) string {
	return strconv.Itoa(int(prefix[0])) + "." + strconv.Itoa(int(prefix[1])) + "." +
		strconv.Itoa(i/256%256) + "." + strconv.Itoa(i%256)
}

// genSnapshot returns n services × 10 endpoints plus node-a as a kubectl
// List in JSON.
func genSnapshot(tb testing.TB, n int) []byte {
	tb.Helper()
	items := []any{&v1.Node{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
		Status:     v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "198.17.0.10"}}},
	}}
	for i := range n {
		name := "svc-" + strconv.Itoa(i)
		items = append(items, &v1.Service{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
			ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name},
			Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: benchAddr([2]byte{198, 19}, i),
				Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}},
		})
		var eps []discovery.Endpoint
		for j := range benchEndpointsPerService {
			k := i*benchEndpointsPerService + j
			eps = append(eps, discovery.Endpoint{Addresses: []string{benchAddr([2]byte{198, 18}, k%65536)},
				NodeName: ptr.To("node-b"), Conditions: discovery.EndpointConditions{Ready: ptr.To(true)}})
		}
		items = append(items, &discovery.EndpointSlice{
			TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
			ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name + "-1",
				Labels: map[string]string{discovery.LabelServiceName: name}},
			AddressType: discovery.AddressTypeIPv4,
			Endpoints:   eps,
			Ports:       []discovery.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
		})
	}
	data, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	if err != nil {
		tb.Fatal(err)
	}
	return data
}

func writeSnapshot(tb testing.TB, n int) string {
	tb.Helper()
	quietLog(tb)
	path := filepath.Join(tb.TempDir(), "snapshot.json")
	if err := os.WriteFile(path, genSnapshot(tb, n), 0o644); err != nil {
		tb.Fatal(err)
	}
	return path
}

// quietLog keeps the source's log lines out of benchmark output, where
// they would split the result lines.
func quietLog(tb testing.TB) {
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
	tb.Cleanup(func() { klog.LogToStderr(true) })
}

// discard is an EventHandler that keeps nothing.
type discard struct{ events int }

func (d *discard) ServiceUpdated(*v1.Service)                    { d.events++ }
func (d *discard) ServiceDeleted(*v1.Service)                    { d.events++ }
func (d *discard) EndpointSliceUpdated(*discovery.EndpointSlice) { d.events++ }
func (d *discard) EndpointSliceDeleted(*discovery.EndpointSlice) { d.events++ }
func (d *discard) NodeUpdated(*v1.Node)                          { d.events++ }
func (d *discard) NodeDeleted(*v1.Node)                          { d.events++ }
func (d *discard) ServiceCIDRsUpdated([]*networking.ServiceCIDR) { d.events++ }
func (d *discard) Synced()                                       {}

// BenchmarkReread measures what the watcher does when a 10k snapshot is
// written again unchanged: read and parse it, build the new state and diff
// it against the current one (which must deliver nothing).
func BenchmarkReread(b *testing.B) {
	path := writeSnapshot(b, 10000)
	cur := (&fileSource{path: path}).initialState(fileOptions, &discard{})
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		h := &discard{}
		next, errs := reread(cur, path, h)
		if len(errs) != 0 || h.events != 0 {
			b.Fatalf("unchanged reread: %d errors, %d events", len(errs), h.events)
		}
		cur = next
	}
}

// BenchmarkStateHeap loads a 10k snapshot as Run does at start and reports
// the live heap that remains once the objects have been handed over: with
// a handler that keeps nothing (what the source itself retains) and with a
// real model.Tracker (what the process retains). It reports metrics, not
// timings; run with -benchtime 1x.
func BenchmarkStateHeap(b *testing.B) {
	path := writeSnapshot(b, 10000)
	for _, tc := range []struct {
		name    string
		handler func() model.EventHandler
	}{
		{"discard", func() model.EventHandler { return &discard{} }},
		{"tracker", func() model.EventHandler {
			return model.NewTracker(model.TrackerOptions{Hostname: "node-a", Families: []v1.IPFamily{v1.IPv4Protocol}})
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var inuse float64
			for range b.N {
				before := liveHeap()
				h := tc.handler()
				st := (&fileSource{path: path}).initialState(fileOptions, h)
				after := liveHeap()
				runtime.KeepAlive(st)
				runtime.KeepAlive(h)
				inuse = float64(after-before) / (1 << 20)
			}
			b.ReportMetric(inuse, "MiB-live")
		})
	}
}

// liveHeap returns the heap in use after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// fileOptions reads a single file as the source does.
var fileOptions = loadOptions{limit: maxFileSize}

// reread does what Run does on a change of a file that stays readable.
func reread(cur *state, path string, h model.EventHandler) (*state, []error) {
	_, errs, res := load(path, fileOptions, cur)
	deliverDiff(cur, res.state, res.objects, h)
	return res.state, errs
}
