package harness

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/kernel/conntrack"
	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/nft/nfttest"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/nftables"
	"github.com/kproxy/kproxy/internal/source/apiserver"
	"github.com/kproxy/kproxy/test/bench/cluster"
	"github.com/kproxy/kproxy/test/e2e/framework"
)

// A hollow node is kproxy's control path in nftables mode without a
// kernel: the API server source (its own client, so its own connection
// and watches), the model's tracker, the sync loop and the nftables
// proxier's render, committing to nfttest.Fake, the in-memory nf_tables.
// RunHollow runs many of them in this process against one API server
// holding a generated cluster, as upstream measures kube-proxy at scale
// with kubemark's hollow proxy.

// HollowOptions say what RunHollow runs.
type HollowOptions struct {
	// Proxy is what each node runs: "kproxy" (the default, in this
	// process) or "upstream" (kubemark's hollow proxy, a process per
	// node; see upstreamHollow).
	Proxy    string
	Nodes    int
	Services int
	Seed     uint64
	// Changes is how many endpoint changes (a pod rescheduled: a new
	// endpoint address) are written one after the other, Gap apart.
	Changes int
	Gap     time.Duration
	// SeeTimeout bounds the wait for every node to program one change,
	// and for every node's first sync.
	SeeTimeout time.Duration
	// NoGzip makes kproxy's nodes refuse gzip (rest.Config's
	// DisableCompression): the API server then sends their streaming
	// lists uncompressed, trading its gzip CPU for bytes on the wire.
	NoGzip bool
	// FullSyncs, when positive, is how many nodes may run a full sync at
	// once (0: all). Nodes sharing one process add up the garbage of
	// their first syncs, which real nodes each pay on their own; on 2
	// cores more than a few at once only stack it up.
	FullSyncs int
	// HeapProfile, when set, is where the heap profile of this process
	// (kproxy's nodes) is written after the changes, the nodes running.
	HeapProfile string
}

// HollowResult is one RunHollow.
type HollowResult struct {
	Proxy     string `json:"proxy"`
	NoGzip    bool   `json:"noGzip,omitempty"`
	Nodes     int    `json:"nodes"`
	Services  int    `json:"services"`
	Endpoints int    `json:"endpoints"`
	// AllSynced: from starting the nodes until every node's first sync
	// of both families was committed.
	AllSynced time.Duration `json:"allSynced"`
	// kproxy's nodes share this process: RSS and heap per node are the
	// process's growth over its baseline (the cluster created, no node
	// started) divided by Nodes, measured after the changes; CPU per
	// node is the process's CPU from the nodes' start to the end over
	// Nodes (the writer of the changes included, which is small).
	// Upstream's nodes are processes of their own: RSS per node is the
	// mean of their RSS after the changes (RSSMaxMiB the largest, the
	// baseline 0 and the end their sum), CPU per node the mean of
	// their CPU; heap and kernel figures are not known (0).
	RSSBaselineMiB float64 `json:"rssBaselineMiB"`
	RSSEndMiB      float64 `json:"rssEndMiB"`
	RSSPerNodeMiB  float64 `json:"rssPerNodeMiB"`
	RSSMaxMiB      float64 `json:"rssMaxMiB,omitempty"`
	// RSSPeakPerNodeMiB (kproxy) is the process's peak RSS (VmHWM) over
	// its baseline divided by Nodes: what N nodes need at once, the
	// first syncs' garbage included.
	RSSPeakPerNodeMiB float64 `json:"rssPeakPerNodeMiB,omitempty"`
	HeapPerNodeMiB    float64 `json:"heapPerNodeMiB"`
	// FakeKernelMiB is the part of a node's heap that is its in-memory
	// kernel (nfttest.Fake, both families), which a real node keeps in
	// the kernel: the heap a copy of node 0's rulesets takes.
	FakeKernelMiB   float64 `json:"fakeKernelMiB"`
	CPUPerNode      float64 `json:"cpuPerNodeSeconds"`
	CPUToSyncedNode float64 `json:"cpuToSyncedPerNodeSeconds"`
	// BytesPerNode: bytes each node's client read from its connections
	// to the API server (TLS records, as on the wire), from its start to
	// the end: mean, min and max over the nodes.
	BytesMean, BytesMin, BytesMax int64
	// Latencies: for every change and every node, the time from the
	// slice's write (its EndpointsLastChangeTriggerTime) until a
	// committed transaction of that node held the new address. None for
	// upstream's hollow proxy, which programs nothing.
	Latencies      []time.Duration `json:"-"`
	P50, P99, Max  time.Duration
	Missed         []string `json:"missed,omitempty"`
	ChangesWritten int
	// The API server: CPU seconds from the nodes' start to their first
	// syncs and to the end, RSS before the nodes and at the end, and its
	// watches of services and endpoint slices
	// (see apiWatchFigures) before the nodes and at the end.
	APIServerCPUToSynced, APIServerCPU          float64
	APIServerRSSBeforeNodesMiB, APIServerRSSMiB float64
	APIBefore, APIEnd                           apiWatchFigures
	// The process's CPU from the nodes' start to their first syncs, and
	// each node's mean API bytes by then.
	AllSyncedCPUProcessSeconds float64
	BytesToSyncedMean          int64
	// The machine's load averages (1, 5, 15 minutes) before and after.
	LoadBefore, LoadEnd string
}

// hollowNode is one node's control path and what the harness observes
// of it.
type hollowNode struct {
	name  string
	fakes map[v1.IPFamily]*nfttest.Fake
	// received counts the bytes its client read from the API server.
	received atomic.Int64
	// fullSyncs is shared by the nodes of a run (see
	// HollowOptions.FullSyncs); nil: no limit.
	fullSyncs chan struct{}

	mu sync.Mutex
	// synced: families whose first sync committed; syncedCh is closed
	// when both did.
	synced   map[v1.IPFamily]bool
	syncedCh chan struct{}
	// want: addresses awaited (address → when the first committed
	// transaction holding it was seen, zero until then).
	want map[string]time.Time
}

// watch starts waiting for addr.
func (n *hollowNode) watch(addr string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.want[addr] = time.Time{}
}

// seen is when addr was first committed, zero if not yet.
func (n *hollowNode) seen(addr string) time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.want[addr]
}

// committed looks for the awaited addresses in a transaction the fake
// kernel accepted.
func (n *hollowNode) committed(tx *nft.Transaction) {
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	var text string
	for addr, at := range n.want {
		if !at.IsZero() {
			continue
		}
		if text == "" {
			text = tx.String()
		}
		if containsEndpoint(text, addr) {
			n.want[addr] = now
		}
	}
}

// containsEndpoint says whether text holds the endpoint ep
// (netip.AddrPort's form) as nft writes it: "198.18.1.1:80" or
// "[fd00:18:1::1]:80" in a DNAT, "198.18.1.1 . 80" in an endpoint map's
// element; never as part of a longer address or port (198.18.1.10,
// 2198.18.1.1, :8080). Pod addresses repeat at 10k services (the
// generator's address space wraps, with other ports), so the port is
// part of what is looked for.
func containsEndpoint(text, ep string) bool {
	ap, err := netip.ParseAddrPort(ep)
	if err != nil {
		return false
	}
	part := func(c byte) bool {
		return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c == '.' || c == ':'
	}
	port := strconv.Itoa(int(ap.Port()))
	for _, form := range []string{ep, ap.Addr().String() + " . " + port} {
		for i := 0; ; {
			j := strings.Index(text[i:], form)
			if j < 0 {
				break
			}
			start, end := i+j, i+j+len(form)
			if (start == 0 || !part(text[start-1])) && (end == len(text) || text[end] < '0' || text[end] > '9') {
				return true
			}
			i = start + 1
		}
	}
	return false
}

// watchedNFT is the fake kernel of one family of a node: it tells the
// node about every committed transaction.
type watchedNFT struct {
	*nfttest.Fake
	n *hollowNode
}

func (w watchedNFT) Apply(ctx context.Context, tx *nft.Transaction) error {
	err := w.Fake.Apply(ctx, tx)
	// The fake records every transaction for tests to look at, the
	// caller's own included: a node's would keep every sync's (a full
	// sync's is ~100 MiB at 10k services) for nobody.
	w.Fake.ResetApplies()
	if err != nil {
		return err
	}
	w.n.committed(tx)
	return nil
}

// syncWatch is a family's backend, noting its first successful sync;
// full syncs wait for a place in full (when not nil).
type syncWatch struct {
	proxy.Backend
	n    *hollowNode
	f    v1.IPFamily
	full chan struct{}
}

func (s syncWatch) Sync(ctx context.Context, req *proxy.Request) (*proxy.Result, error) {
	if req.Full && s.full != nil {
		select {
		case s.full <- struct{}{}:
			defer func() { <-s.full }()
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	r, err := s.Backend.Sync(ctx, req)
	if err == nil && !req.Trial {
		s.n.mu.Lock()
		if !s.n.synced[s.f] {
			s.n.synced[s.f] = true
			if len(s.n.synced) == len(s.n.fakes) {
				close(s.n.syncedCh)
			}
		}
		s.n.mu.Unlock()
	}
	return r, err
}

// countingConn counts what is read from it.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	k, err := c.Conn.Read(p)
	c.n.Add(int64(k))
	return k, err
}

var hollowFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}

// startHollow starts one hollow node named name with node address addr;
// kubeconfig is a kube-proxy credential. Its goroutines end when ctx is
// done; wg counts them.
func startHollow(ctx context.Context, wg *sync.WaitGroup, cp *framework.ControlPlane, kubeconfig, name string, addr netip.Addr, noGzip bool, fullSyncs chan struct{}) (*hollowNode, error) {
	n := newHollowNode(name)
	n.fullSyncs = fullSyncs
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	// As kproxy's client (apiserver.NewClient's defaults): protobuf,
	// 5 QPS, burst 10. Its own dialer: its own connection (a config with
	// a Dial is never shared through client-go's transport cache), made
	// in the control plane's namespace and counted.
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.QPS, cfg.Burst = 5, 10
	cfg.UserAgent = "kproxy-hollow/" + name
	cfg.DisableCompression = noGzip
	dial := framework.DialContextIn(cp.Namespace)
	cfg.Dial = func(ctx context.Context, network, address string) (net.Conn, error) {
		c, err := dial(ctx, network, address)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, n: &n.received}, nil
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	tracker, loop, err := n.build(addr)
	if err != nil {
		return nil, err
	}
	src := apiserver.New(client, name, 15*time.Minute)
	wg.Add(2)
	go func() { defer wg.Done(); loop.Run(ctx) }()
	go func() { defer wg.Done(); _ = src.Run(ctx, tracker) }()
	return n, nil
}

func newHollowNode(name string) *hollowNode {
	return &hollowNode{name: name, fakes: map[v1.IPFamily]*nfttest.Fake{}, synced: map[v1.IPFamily]bool{},
		syncedCh: make(chan struct{}), want: map[string]time.Time{}}
}

// build makes n's control path below its source, with node address
// addr: the tracker a source feeds and the sync loop, with a proxier and
// an in-memory kernel per family.
func (n *hollowNode) build(addr netip.Addr) (*model.Tracker, *proxy.Loop, error) {
	name := n.name
	local := func() ([]netip.Addr, error) { return []netip.Addr{addr}, nil }
	backends := map[v1.IPFamily]proxy.Backend{}
	for _, f := range hollowFamilies {
		fake := nfttest.New()
		n.fakes[f] = fake
		var ips []netip.Addr
		if f == v1.IPv4Protocol {
			ips = []netip.Addr{addr}
		}
		p, err := nftables.NewProxier(nftables.Options{
			Family: f, TableName: nftables.DefaultTableName, ModeOptions: config.ModeOptions{MasqueradeBit: 14, NodeIPs: ips},
		}, nftables.Handles{NFT: watchedNFT{Fake: fake, n: n}, HostHandles: proxy.HostHandles{Conntrack: &conntrack.Fake{}, LocalAddrs: local}})
		if err != nil {
			return nil, nil, err
		}
		backends[f] = syncWatch{Backend: p, n: n, f: f, full: n.fullSyncs}
	}
	var loop *proxy.Loop
	tracker := model.NewTracker(model.TrackerOptions{Hostname: name, Families: hollowFamilies, OnChange: func() {
		if loop != nil {
			loop.Changed()
		}
	}})
	// kproxy's defaults (upstream's): sync-period 30 s, min-sync-period
	// 1 s, the hourly full sync, families in parallel.
	loop = proxy.New(proxy.Options{
		Tracker: tracker, Backends: backends, SyncPeriod: 30 * time.Second, FullSyncPeriod: proxy.DefaultFullSyncPeriod,
		MinSyncPeriod: time.Second, RetryInterval: 5 * time.Second, ParallelFamilies: true,
	})
	return tracker, loop, nil
}

// RunHollow creates the cluster in a new control plane, starts the
// hollow nodes, writes the changes and measures (see HollowResult). A
// change some kproxy node never programs within SeeTimeout is in Missed
// (and the run goes on); the caller decides whether that fails.
func RunHollow(tb *TB, o HollowOptions) *HollowResult {
	if o.SeeTimeout <= 0 {
		o.SeeTimeout = time.Minute
	}
	if o.Proxy == "" {
		o.Proxy = "kproxy"
	}
	upstream := o.Proxy == "upstream"
	var kubemark string
	switch {
	case upstream:
		var err error
		if kubemark, err = upstreamHollowBin(); err != nil {
			tb.Fatal(err)
		}
	case o.Proxy != "kproxy":
		tb.Fatalf("hollow proxy %q: want kproxy or upstream", o.Proxy)
	}
	c, err := cluster.Generate(cluster.Options{Services: o.Services, Mix: cluster.Realistic, Seed: o.Seed})
	if err != nil {
		tb.Fatal(err)
	}
	a := startAPICluster(tb, c)
	r := &HollowResult{Proxy: o.Proxy, NoGzip: o.NoGzip && !upstream, Nodes: o.Nodes, Services: o.Services, Endpoints: c.Endpoints()}
	kubeconfig := a.cp.Kubeconfig(tb, "system:kube-proxy")
	apiPid := a.cp.APIServer.Pid()
	self := os.Getpid()

	// The nodes' Node objects, addressed after the cluster's own.
	for i := range o.Nodes {
		a.cp.CreateNode(tb, hollowName(i), cluster.NodeIP(len(c.Nodes)+i))
	}
	r.APIBefore = a.watchFigures(tb)
	debug.FreeOSMemory()
	r.RSSBaselineMiB = procStatusMiB(self, "VmRSS")
	heapBefore := heapInuseMiB()
	cpuBefore, apiCPUBefore := cpuSeconds(self), cpuSeconds(apiPid)
	r.APIServerRSSBeforeNodesMiB = procStatusMiB(apiPid, "VmRSS")
	r.LoadBefore = loadAvg()

	ctx, cancel := context.WithCancel(tb.Context())
	var wg sync.WaitGroup
	tb.Cleanup(func() { cancel(); wg.Wait() })
	start := time.Now()
	// What the harness needs of every node, whichever proxy it runs.
	var (
		nodes    []*hollowNode
		ups      []*upstreamHollow
		synced   = make([]<-chan struct{}, o.Nodes)
		exited   = make([]<-chan struct{}, o.Nodes)
		received = make([]*atomic.Int64, o.Nodes)
	)
	var fullSyncs chan struct{}
	if o.FullSyncs > 0 {
		fullSyncs = make(chan struct{}, o.FullSyncs)
	}
	for i := range o.Nodes {
		name := hollowName(i)
		if upstream {
			u, err := startUpstreamHollow(ctx, tb, a.cp, kubemark, kubeconfig, name)
			if err != nil {
				tb.Fatalf("node %s: %v", name, err)
			}
			ups = append(ups, u)
			synced[i], exited[i], received[i] = u.syncedCh, u.proc.Done(), &u.received
			continue
		}
		n, err := startHollow(ctx, &wg, a.cp, kubeconfig, name, cluster.NodeIP(len(c.Nodes)+i), o.NoGzip, fullSyncs)
		if err != nil {
			tb.Fatalf("node %s: %v", name, err)
		}
		nodes = append(nodes, n)
		synced[i], received[i] = n.syncedCh, &n.received
	}
	// The processes' CPU (upstream), or this process's (kproxy).
	nodesCPU := func() float64 {
		if !upstream {
			return cpuSeconds(self) - cpuBefore
		}
		sum := 0.0
		for _, u := range ups {
			sum += cpuSeconds(u.proc.Pid())
		}
		return sum
	}
	deadline := time.After(o.SeeTimeout)
	for i := range o.Nodes {
		select {
		case <-synced[i]:
		case <-exited[i]:
			tb.Fatalf("node %s exited before its first sync: %v\n%s", hollowName(i), ups[i].proc.ExitError(), ups[i].proc.Tail(20))
		case <-deadline:
			tb.Fatalf("node %s: no first sync within %s", hollowName(i), o.SeeTimeout)
		}
	}
	r.AllSynced = time.Since(start)
	r.AllSyncedCPUProcessSeconds = nodesCPU()
	r.CPUToSyncedNode = r.AllSyncedCPUProcessSeconds / float64(o.Nodes)
	r.APIServerCPUToSynced = cpuSeconds(apiPid) - apiCPUBefore
	var sum int64
	for _, b := range received {
		sum += b.Load()
	}
	r.BytesToSyncedMean = sum / int64(o.Nodes)
	tb.Logf("%d %s hollow nodes synced in %s", o.Nodes, o.Proxy, r.AllSynced.Round(time.Millisecond))

	known := map[string]bool{}
	for _, s := range c.Slices {
		for _, e := range s.Endpoints {
			for _, p := range s.Ports {
				known[endpointKey(e.Addresses[0], p)] = true
			}
		}
	}
	kinds := map[string]cluster.Kind{}
	for i, s := range c.Services {
		kinds[s.Name] = c.Kinds[i]
	}
	for range o.Changes {
		ch := c.Reschedule()
		var addrs []string
		for _, obj := range ch.Update {
			s := obj.(*discovery.EndpointSlice)
			// A Local internal traffic policy keeps other nodes'
			// endpoints out of every hollow node's rules.
			measured := kinds[s.Labels[discovery.LabelServiceName]] != cluster.KindITPLocal
			for _, e := range s.Endpoints {
				if len(s.Ports) == 0 {
					continue
				}
				if ad := endpointKey(e.Addresses[0], s.Ports[0]); !known[ad] {
					known[ad] = true
					if measured {
						addrs = append(addrs, ad)
					}
				}
			}
		}
		for _, ad := range addrs {
			for _, n := range nodes {
				n.watch(ad)
			}
		}
		written := time.Now()
		for _, obj := range ch.Update {
			if err := a.update(ctx, obj); err != nil {
				tb.Fatalf("change %q: %v", ch.Name, err)
			}
		}
		r.ChangesWritten++
		if len(addrs) > 0 && !upstream {
			r.Missed = append(r.Missed, awaitSeen(nodes, addrs, written, o.SeeTimeout, &r.Latencies)...)
		}
		time.Sleep(o.Gap)
	}

	runtime.GC()
	r.CPUPerNode = nodesCPU() / float64(o.Nodes)
	if upstream {
		for _, u := range ups {
			rss := procStatusMiB(u.proc.Pid(), "VmRSS")
			r.RSSEndMiB += rss
			r.RSSMaxMiB = max(r.RSSMaxMiB, rss)
		}
		r.RSSBaselineMiB = 0
		r.RSSPerNodeMiB = r.RSSEndMiB / float64(o.Nodes)
	} else {
		// As kproxy does once idle (internal/idlemem): the garbage
		// and free heap the syncs left go back to the system. Nodes
		// sharing one process have no idlemem of their own.
		debug.FreeOSMemory()
		r.RSSEndMiB = procStatusMiB(self, "VmRSS")
		r.RSSPeakPerNodeMiB = (procStatusMiB(self, "VmHWM") - r.RSSBaselineMiB) / float64(o.Nodes)
		r.RSSPerNodeMiB = (r.RSSEndMiB - r.RSSBaselineMiB) / float64(o.Nodes)
		r.HeapPerNodeMiB = (heapInuseMiB() - heapBefore) / float64(o.Nodes)
		r.FakeKernelMiB = fakeKernelMiB(tb, nodes[0])
		if o.HeapProfile != "" {
			writeHeapProfile(tb, o.HeapProfile)
		}
	}
	r.APIServerCPU = cpuSeconds(apiPid) - apiCPUBefore
	r.APIServerRSSMiB = procStatusMiB(apiPid, "VmRSS")
	r.APIEnd = a.watchFigures(tb)
	r.LoadEnd = loadAvg()
	r.BytesMin = -1
	sum = 0
	for _, c := range received {
		b := c.Load()
		sum += b
		r.BytesMax = max(r.BytesMax, b)
		if r.BytesMin < 0 || b < r.BytesMin {
			r.BytesMin = b
		}
	}
	r.BytesMean = sum / int64(o.Nodes)
	slices.Sort(r.Latencies)
	r.P50, r.P99 = quantile(r.Latencies, 0.5), quantile(r.Latencies, 0.99)
	if len(r.Latencies) > 0 {
		r.Max = r.Latencies[len(r.Latencies)-1]
	}
	return r
}

// fakeKernelMiB is the heap that a copy of n's in-memory kernels takes.
func fakeKernelMiB(tb testing.TB, n *hollowNode) float64 {
	dumps := map[v1.IPFamily]string{}
	for f, fake := range n.fakes {
		dumps[f] = fake.Dump()
	}
	runtime.GC()
	before := heapInuseMiB()
	var copies []*nfttest.Fake
	for f, d := range dumps {
		c := nfttest.New()
		if err := c.Load(d); err != nil {
			tb.Fatalf("node %s: loading its %s ruleset again: %v", n.name, f, err)
		}
		c.ResetApplies() // the state alone, as the node's fakes keep it
		copies = append(copies, c)
	}
	runtime.GC()
	size := heapInuseMiB() - before
	runtime.KeepAlive(copies)
	return size
}

// awaitSeen waits until every node committed every address of one
// change, or timeout; it appends each node's latency per address and
// returns what some node never committed.
func awaitSeen(nodes []*hollowNode, addrs []string, written time.Time, timeout time.Duration, lat *[]time.Duration) []string {
	var missed []string
	deadline := written.Add(timeout)
	for _, n := range nodes {
		for _, ad := range addrs {
			for n.seen(ad).IsZero() && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			at := n.seen(ad)
			if at.IsZero() {
				missed = append(missed, fmt.Sprintf("node %s never programmed endpoint %s within %s", n.name, ad, timeout))
				continue
			}
			*lat = append(*lat, at.Sub(written))
		}
	}
	return missed
}

// endpointKey is what a node's rules hold of an endpoint at port p of
// its slice: address and port, netip.AddrPort's form.
func endpointKey(addr string, p discovery.EndpointPort) string {
	port := uint16(0)
	if p.Port != nil {
		port = uint16(*p.Port)
	}
	return netip.AddrPortFrom(netip.MustParseAddr(addr), port).String()
}

func hollowName(i int) string { return "hollow-" + strconv.Itoa(i) }

// quantile of sorted durations (nearest rank); 0 when empty.
func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	i := int(q*float64(len(d))+0.5) - 1
	return d[min(max(i, 0), len(d)-1)]
}

func heapInuseMiB() float64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapInuse) / (1 << 20)
}

// loadAvg is /proc/loadavg's three load averages.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

// apiWatchFigures are what the API server's metrics say of its watches
// of services and endpoint slices.
type apiWatchFigures struct {
	// Watches: open WATCH requests (apiserver_longrunning_requests).
	// Events and Bytes: watch events sent and their encoded size
	// (apiserver_watch_events_total, apiserver_watch_events_sizes_sum),
	// counters.
	Watches, Events, Bytes float64
	// HeapMiB is the API server's Go heap in use
	// (go_memstats_heap_inuse_bytes): unlike its RSS, it does not keep
	// the high-water mark of a burst.
	HeapMiB float64
}

// watchFigures scrapes the API server's /metrics.
func (a *apiCluster) watchFigures(tb *TB) apiWatchFigures {
	ctx, cancel := context.WithTimeout(tb.Context(), 30*time.Second)
	defer cancel()
	raw, err := a.cp.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		tb.Fatalf("API server metrics: %v", err)
	}
	m, err := parseMetrics(bytes.NewReader(raw))
	if err != nil {
		tb.Fatalf("API server metrics: %v", err)
	}
	ours := func(labels string) bool {
		return strings.Contains(labels, `resource="endpointslices"`) || strings.Contains(labels, `resource="services"`)
	}
	var w apiWatchFigures
	for labels, v := range m.Series("apiserver_longrunning_requests") {
		if strings.Contains(labels, `verb="WATCH"`) && ours(labels) {
			w.Watches += v
		}
	}
	for labels, v := range m.Series("apiserver_watch_events_total") {
		if ours(labels) {
			w.Events += v
		}
	}
	w.HeapMiB = m.Sum("go_memstats_heap_inuse_bytes") / (1 << 20)
	for labels, v := range m.Series("apiserver_watch_events_sizes_sum") {
		if ours(labels) {
			w.Bytes += v
		}
	}
	return w
}

// WriteHollowTable prints r as a table.
func WriteHollowTable(w io.Writer, r *HollowResult) {
	kib := func(b int64) string { return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10)) }
	rss := fmt.Sprintf("%.2f MiB (baseline %.1f, end %.1f)", r.RSSPerNodeMiB, r.RSSBaselineMiB, r.RSSEndMiB)
	heap, kernel, lat := fmt.Sprintf("%.2f MiB", r.HeapPerNodeMiB), fmt.Sprintf("%.2f MiB", r.FakeKernelMiB),
		fmt.Sprintf("%s / %s / %s", r.P50.Round(time.Millisecond), r.P99.Round(time.Millisecond), r.Max.Round(time.Millisecond))
	if r.Proxy == "upstream" {
		rss = fmt.Sprintf("%.2f MiB (max %.1f, sum %.1f)", r.RSSPerNodeMiB, r.RSSMaxMiB, r.RSSEndMiB)
		heap, kernel, lat = "n/a", "n/a", "n/a (no rules)"
	}
	rows := [][2]string{
		{"proxy", r.Proxy + map[bool]string{true: " (gzip refused)"}[r.NoGzip]},
		{"nodes × services (endpoints)", fmt.Sprintf("%d × %d (%d)", r.Nodes, r.Services, r.Endpoints)},
		{"load average before / after", r.LoadBefore + " / " + r.LoadEnd},
		{"all nodes synced", r.AllSynced.Round(time.Millisecond).String()},
		{"CPU per node to synced", fmt.Sprintf("%.3f s", r.CPUToSyncedNode)},
		{"CPU per node, whole run", fmt.Sprintf("%.3f s", r.CPUPerNode)},
		{"RSS per node", rss},
		{"peak RSS per node (kproxy: the process's VmHWM over its baseline / N)", fmt.Sprintf("%.2f MiB", r.RSSPeakPerNodeMiB)},
		{"heap in use per node (Δ/N)", heap},
		{"of which the in-memory kernel (a copy of node 0's)", kernel},
		{"API bytes per node to synced (mean)", kib(r.BytesToSyncedMean)},
		{"API bytes per node, whole run mean/min/max", kib(r.BytesMean) + " / " + kib(r.BytesMin) + " / " + kib(r.BytesMax)},
		{"changes written / samples (node × address)", fmt.Sprintf("%d / %d", r.ChangesWritten, len(r.Latencies))},
		{"change → rules p50 / p99 / max (all nodes)", lat},
		{"missed (node, change)", strconv.Itoa(len(r.Missed))},
		{"API server CPU to synced / whole run", fmt.Sprintf("%.2f s / %.2f s", r.APIServerCPUToSynced, r.APIServerCPU)},
		{"API server RSS before nodes / end", fmt.Sprintf("%.1f MiB / %.1f MiB", r.APIServerRSSBeforeNodesMiB, r.APIServerRSSMiB)},
		{"API server heap in use before nodes / end", fmt.Sprintf("%.1f MiB / %.1f MiB", r.APIBefore.HeapMiB, r.APIEnd.HeapMiB)},
		{"API server WATCH requests (svc+slices) before / end", fmt.Sprintf("%.0f / %.0f", r.APIBefore.Watches, r.APIEnd.Watches)},
		{"API server watch events sent (svc+slices), nodes' run", fmt.Sprintf("%.0f (%.2f MiB encoded)", r.APIEnd.Events-r.APIBefore.Events, (r.APIEnd.Bytes-r.APIBefore.Bytes)/(1<<20))},
	}
	fmt.Fprintf(w, "| figure | value |\n|---|---|\n")
	for _, row := range rows {
		fmt.Fprintf(w, "| %s | %s |\n", row[0], row[1])
	}
}

// writeHeapProfile writes the heap profile (after a collection) to path.
func writeHeapProfile(tb testing.TB, path string) {
	runtime.GC()
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		tb.Fatal(err)
	}
}
