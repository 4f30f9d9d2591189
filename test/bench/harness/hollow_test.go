package harness

import (
	"context"
	"flag"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/nft/nfttest"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/test/e2e/framework"
)

// The many-node run at a chosen size, e.g. (as root)
//
//	KPROXY_E2E=1 KPROXY_E2E_BIN=$PWD/_output/bin go test ./test/bench/harness -run '^$' \
//	  -bench '^BenchmarkHollowScale$' -benchtime 1x -v -timeout 60m -hollow.nodes 40 -hollow.services 1000 \
//	  -hollow.proxies kproxy,upstream
var (
	hollowProxies   = flag.String("hollow.proxies", "kproxy", "BenchmarkHollowScale: comma-separated, run one after the other, each with its own API server: kproxy, upstream (kubemark --morph=proxy)")
	hollowNodes     = flag.Int("hollow.nodes", 30, "BenchmarkHollowScale: hollow nodes")
	hollowServices  = flag.Int("hollow.services", 1000, "BenchmarkHollowScale: services of the realistic mix")
	hollowChanges   = flag.Int("hollow.changes", 20, "BenchmarkHollowScale: endpoint changes, one at a time")
	hollowNoGzip    = flag.Bool("hollow.no-gzip", false, "BenchmarkHollowScale: kproxy's nodes refuse gzip (the API server's compression of streaming lists)")
	hollowFullSyncs = flag.Int("hollow.full-syncs", 0, "BenchmarkHollowScale: kproxy nodes that may run a full sync at once (0: all), bounding the process's peak memory")
	hollowGap       = flag.Duration("hollow.gap", 500*time.Millisecond, "BenchmarkHollowScale: pause after each change")
	hollowTimeout   = flag.Duration("hollow.timeout", 5*time.Minute, "BenchmarkHollowScale: how long every node may take to its first sync, and to see each change (raise it with -hollow.full-syncs at many nodes)")
)

// runHollow runs o in t's scope and fails t when a node missed a change.
func runHollow(t testing.TB, o HollowOptions) *HollowResult {
	t.Helper()
	needControlPlane(t)
	tb := NewTB(context.Background(), testLog{t}, t.Name())
	var r *HollowResult
	if err := tb.Scope("hollow", func(tb *TB) { r = RunHollow(tb, o) }); err != nil {
		t.Fatal(err)
	}
	var table strings.Builder
	WriteHollowTable(&table, r)
	t.Logf("\n%s", table.String())
	for _, m := range r.Missed {
		t.Error(m)
	}
	return r
}

// TestHollowNodes runs 5 hollow kproxy nodes (nftables mode, the
// in-memory kernel) against one kube-apiserver holding 100 services of
// the realistic mix, and writes three endpoint changes: every node must
// program every change, through a watch of its own.
func TestHollowNodes(t *testing.T) {
	const nodes, changes = 5, 3
	r := runHollow(t, HollowOptions{Nodes: nodes, Services: 100, Seed: 1, Changes: changes, Gap: 200 * time.Millisecond, SeeTimeout: 30 * time.Second})
	if r.ChangesWritten != changes {
		t.Errorf("%d changes written, want %d", r.ChangesWritten, changes)
	}
	// A rescheduled pod is one new address; a change of a service with
	// a Local internal traffic policy is not measured.
	if len(r.Latencies) == 0 || len(r.Latencies)%nodes != 0 {
		t.Errorf("%d latency samples, want a positive multiple of %d nodes", len(r.Latencies), nodes)
	}
	for _, l := range r.Latencies {
		if l <= 0 || l > 30*time.Second {
			t.Errorf("latency %s out of range", l)
		}
	}
	// Each node watches services and endpoint slices itself.
	if got := r.APIEnd.Watches - r.APIBefore.Watches; got < 2*nodes {
		t.Errorf("the API server serves %v more WATCH requests of services and slices with the nodes running, want at least %d", got, 2*nodes)
	}
	if r.BytesMin <= 0 || r.FakeKernelMiB <= 0 || r.AllSynced <= 0 || r.APIServerRSSMiB <= 0 || r.RSSEndMiB <= 0 {
		t.Errorf("a figure is missing: %+v", r)
	}
}

// TestHollowUpstream runs 3 of upstream's hollow proxies (kubemark
// --morph=proxy) against one kube-apiserver holding 100 services: each
// must sync through watches of its own, behind a relay that counts its
// bytes. It is skipped when kubemark is not built.
func TestHollowUpstream(t *testing.T) {
	needControlPlane(t)
	if _, err := upstreamHollowBin(); err != nil {
		t.Skip(err)
	}
	const nodes = 3
	r := runHollow(t, HollowOptions{Proxy: "upstream", Nodes: nodes, Services: 100, Seed: 1, Changes: 2, Gap: 200 * time.Millisecond, SeeTimeout: time.Minute})
	if got := r.APIEnd.Watches - r.APIBefore.Watches; got < 2*nodes {
		t.Errorf("the API server serves %v more WATCH requests of services and slices with the nodes running, want at least %d", got, 2*nodes)
	}
	// Every node received at least the 100 services and their slices.
	if r.BytesMin < 10_000 || r.RSSPerNodeMiB <= 0 || r.CPUPerNode <= 0 || len(r.Latencies) != 0 {
		t.Errorf("figures out of range: bytes min %d, RSS per node %.1f MiB, CPU per node %.2f s, %d latencies", r.BytesMin, r.RSSPerNodeMiB, r.CPUPerNode, len(r.Latencies))
	}
}

// BenchmarkHollowScale is the many-node run at the size the flags give
// (run it with -benchtime 1x), for each proxy of -hollow.proxies in turn;
// it fails as TestHollowNodes does.
func BenchmarkHollowScale(b *testing.B) {
	for range b.N {
		for p := range strings.SplitSeq(*hollowProxies, ",") {
			runHollow(b, HollowOptions{Proxy: p, Nodes: *hollowNodes, Services: *hollowServices, Seed: 1,
				Changes: *hollowChanges, Gap: *hollowGap, SeeTimeout: *hollowTimeout, NoGzip: *hollowNoGzip, HeapProfile: *hollowHeapProfile, FullSyncs: *hollowFullSyncs})
		}
	}
}

// TestAwaitSeen: a node whose kernel never commits the new address is
// reported missed after the bound; one that commits it is measured.
func TestAwaitSeen(t *testing.T) {
	mk := func(name string) *hollowNode {
		return &hollowNode{name: name, fakes: map[v1.IPFamily]*nfttest.Fake{}, want: map[string]time.Time{}}
	}
	good, silent := mk("good"), mk("silent")
	const addr = "198.18.1.1:80"
	for _, n := range []*hollowNode{good, silent} {
		n.watch(addr)
	}
	written := time.Now()
	parse := func(text string) *nft.Transaction {
		txs, err := nft.Parse(text)
		if err != nil || len(txs) != 1 {
			t.Fatalf("parsing %q: %v (%d transactions)", text, err, len(txs))
		}
		return txs[0]
	}
	// A longer address that starts with addr's is not addr's.
	silent.committed(parse("add table ip t\nadd chain ip t c\nadd rule ip t c meta l4proto tcp dnat to 198.18.1.10:80\n"))
	good.committed(parse("add table ip t\nadd chain ip t c\nadd rule ip t c meta l4proto tcp dnat to " + addr + "\n"))

	var lat []time.Duration
	missed := awaitSeen([]*hollowNode{good, silent}, []string{addr}, written, 100*time.Millisecond, &lat)
	if len(missed) != 1 || !strings.Contains(missed[0], "silent") {
		t.Errorf("missed = %q, want the silent node alone", missed)
	}
	if len(lat) != 1 || lat[0] <= 0 {
		t.Errorf("latencies = %v, want the good node's", lat)
	}
}

func TestContainsEndpoint(t *testing.T) {
	for _, c := range []struct {
		text, ep string
		want     bool
	}{
		{"dnat to 198.18.1.1:80", "198.18.1.1:80", true},
		{"dnat to 198.18.1.1:8080", "198.18.1.1:80", false},
		{"dnat to 198.18.1.10:80", "198.18.1.1:80", false},
		{"dnat to 2198.18.1.1:80", "198.18.1.1:80", false},
		{"elements = { 0 : 198.18.1.1 . 80 }", "198.18.1.1:80", true},
		{"elements = { 0 : 198.18.1.1 . 8080 }", "198.18.1.1:80", false},
		{"elements = { 198.18.1.1 . tcp . 80 }", "198.18.1.1:80", false},
		{"dnat to [fd00:18:1::1a]:80", "[fd00:18:1::1]:80", false},
		{"dnat to [fd00:18:1::1]:80", "[fd00:18:1::1]:80", true},
		{"0 : fd00:18:1::1 . 80", "[fd00:18:1::1]:80", true},
		{"0 : fd00:18:1::1 . 80", "[fd00:18:1::1]:81", false},
	} {
		if got := containsEndpoint(c.text, c.ep); got != c.want {
			t.Errorf("containsEndpoint(%q, %q) = %v, want %v", c.text, c.ep, got, c.want)
		}
	}
}

// needControlPlane skips t where a control plane cannot run, or fails it
// when KPROXY_E2E=1 makes that mandatory (as test/e2e does).
func needControlPlane(t testing.TB) {
	t.Helper()
	if reason := framework.SkipReason(); reason != "" {
		if framework.Mandatory() {
			t.Fatalf("%s=1 but: %s", framework.EnvRun, reason)
		}
		t.Skip(reason)
	}
}

// blockingBackend counts the syncs under way and blocks each until
// release is closed.
type blockingBackend struct {
	running, most *atomic.Int32
	release       chan struct{}
}

func (b blockingBackend) Sync(ctx context.Context, req *proxy.Request) (*proxy.Result, error) {
	n := b.running.Add(1)
	for m := b.most.Load(); n > m && !b.most.CompareAndSwap(m, n); m = b.most.Load() {
	}
	<-b.release
	b.running.Add(-1)
	return &proxy.Result{}, nil
}

// TestFullSyncLimit: with a limit of one, full syncs of several nodes
// run one at a time; partial syncs do not wait for it.
func TestFullSyncLimit(t *testing.T) {
	var running, most atomic.Int32
	release := make(chan struct{})
	full := make(chan struct{}, 1)
	var wg sync.WaitGroup
	sync3 := func(req *proxy.Request) {
		for i := range 3 {
			n := &hollowNode{name: hollowName(i), fakes: map[v1.IPFamily]*nfttest.Fake{}, synced: map[v1.IPFamily]bool{}, syncedCh: make(chan struct{})}
			s := syncWatch{Backend: blockingBackend{&running, &most, release}, n: n, f: v1.IPv4Protocol, full: full}
			wg.Go(func() { _, _ = s.Sync(context.Background(), req) })
		}
	}
	sync3(&proxy.Request{})
	for deadline := time.Now().Add(10 * time.Second); running.Load() < 3 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if got := running.Load(); got != 3 {
		t.Errorf("%d partial syncs under way, want all 3 (no limit for them)", got)
	}
	close(release)
	wg.Wait()
	most.Store(0)
	release = make(chan struct{})
	sync3(&proxy.Request{Full: true})
	time.Sleep(50 * time.Millisecond)
	close(release)
	wg.Wait()
	if got := most.Load(); got != 1 {
		t.Errorf("at most %d full syncs at once, want 1", got)
	}
}
