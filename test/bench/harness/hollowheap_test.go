package harness

import (
	"context"
	"flag"
	"runtime"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/test/bench/cluster"
)

// The heap of one hollow node, without an API server, e.g.
//
//	go test ./test/bench/harness -run '^$' -bench '^BenchmarkHollowNodeHeap$' -benchtime 1x \
//	  -hollow.services 10000 -hollow.heapprofile /tmp/node.heap
//	go tool pprof -sample_index inuse_space -top /tmp/node.heap
var hollowHeapProfile = flag.String("hollow.heapprofile", "", "BenchmarkHollowNodeHeap, BenchmarkHollowScale: write a heap profile here while the nodes still run")

// protoCopy is o as a node's client decodes it from the API server's
// protobuf: every string its own allocation, nothing shared with o or
// with another node's copy.
func protoCopy[T interface {
	Marshal() ([]byte, error)
	Unmarshal([]byte) error
}](tb testing.TB, o, into T) T {
	b, err := o.Marshal()
	if err != nil {
		tb.Fatal(err)
	}
	if err := into.Unmarshal(b); err != nil {
		tb.Fatal(err)
	}
	return into
}

// feedCluster hands c's services and slices to h as the API-server source
// would after its lists: each object decoded afresh, then Synced.
func feedCluster(tb testing.TB, n *hollowNode, h interface {
	ServiceUpdated(*v1.Service)
	EndpointSliceUpdated(*discovery.EndpointSlice)
	NodeUpdated(*v1.Node)
	Synced()
}, c *cluster.Cluster, addr string) {
	h.NodeUpdated(&v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{v1.LabelHostname: n.name}},
		Status:     v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: addr}}},
	})
	for _, o := range c.Objects() {
		switch o := o.(type) {
		case *v1.Service:
			h.ServiceUpdated(protoCopy(tb, o, &v1.Service{}))
		case *discovery.EndpointSlice:
			h.EndpointSliceUpdated(protoCopy(tb, o, &discovery.EndpointSlice{}))
		}
	}
	h.Synced()
}

// BenchmarkHollowNodeHeap runs one hollow node (the tracker, the sync
// loop, the nftables proxier of both families and their in-memory
// kernels) on the realistic mix of -hollow.services, fed in this process
// as the API-server source would feed it, and reports the heap it holds
// once its first syncs and a few endpoint changes are done: all of it
// (heap-MiB), the in-memory kernels (kernel-MiB, a copy of them loaded
// afresh) and the rest (kproxy-MiB). -hollow.heapprofile writes the
// heap profile then.
func BenchmarkHollowNodeHeap(b *testing.B) {
	for range b.N {
		c, err := cluster.Generate(cluster.Options{Services: *hollowServices, Mix: cluster.Realistic, Seed: 1})
		if err != nil {
			b.Fatal(err)
		}
		addr := cluster.NodeIP(len(c.Nodes))
		if *hollowHeapProfile != "" {
			// Every 4 KiB allocated sampled, not every 512 KiB: the
			// figures of a profile of one node are then within a few
			// percent (big maps otherwise come and go between runs).
			runtime.MemProfileRate = 4096
		}
		runtime.GC()
		before := heapInuseMiB()

		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		n := newHollowNode(hollowName(0))
		tracker, loop, err := n.build(addr)
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); loop.Run(ctx) }()
		feedCluster(b, n, tracker, c, addr.String())
		select {
		case <-n.syncedCh:
		case <-time.After(5 * time.Minute):
			b.Fatal("no first sync within 5 minutes")
		}
		// Endpoint changes, each programmed before the next, so that
		// what partial syncs keep is in the figure too.
		known := map[string]bool{}
		for _, s := range c.Slices {
			for _, e := range s.Endpoints {
				for _, p := range s.Ports {
					known[endpointKey(e.Addresses[0], p)] = true
				}
			}
		}
		for range 3 {
			var want []string
			for _, obj := range c.Reschedule().Update {
				s := obj.(*discovery.EndpointSlice)
				tracker.EndpointSliceUpdated(protoCopy(b, s, &discovery.EndpointSlice{}))
				for _, e := range s.Endpoints {
					if ad := endpointKey(e.Addresses[0], s.Ports[0]); len(s.Ports) > 0 && !known[ad] {
						known[ad] = true
						want = append(want, ad)
					}
				}
			}
			for _, ad := range want {
				n.watch(ad)
			}
			if missed := awaitSeen([]*hollowNode{n}, want, time.Now(), time.Minute, new([]time.Duration)); len(missed) > 0 {
				b.Logf("%v (a Local internal traffic policy keeps other nodes' endpoints out)", missed)
			}
		}
		runtime.GC()
		heap := heapInuseMiB() - before
		if *hollowHeapProfile != "" {
			writeHeapProfile(b, *hollowHeapProfile)
		}
		kernel := fakeKernelMiB(b, n)
		b.ReportMetric(heap, "heap-MiB")
		b.ReportMetric(kernel, "kernel-MiB")
		b.ReportMetric(heap-kernel, "kproxy-MiB")
		cancel()
		wg.Wait()
		runtime.KeepAlive(tracker)
	}
}
