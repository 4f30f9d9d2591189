package harness

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kproxy/kproxy/test/bench/cluster"
	"github.com/kproxy/kproxy/test/e2e/framework"
)

// APIResult is one run of one proxy against the real API server.
type APIResult struct {
	Services  int    `json:"services"`
	Endpoints int    `json:"endpoints"`
	Mix       string `json:"mix"`
	Proxy     string `json:"proxy"`
	Mode      string `json:"mode"`
	Rep       int    `json:"rep"`
	// TimeToFirstSync: from the process's start until its first sync of
	// every family ended (informers' list included). FirstSyncSeconds:
	// the longest family's first sync itself (its
	// kubeproxy_sync_proxy_rules_duration_seconds sample). CPUToFirstSync:
	// user+system CPU seconds of the process when that was seen.
	TimeToFirstSync  float64 `json:"timeToFirstSync"`
	FirstSyncSeconds float64 `json:"firstSyncSeconds"`
	CPUToFirstSync   float64 `json:"cpuToFirstSync"`
	// RSS 5 s after the first sync, its peak (VmHWM) then, and both at
	// the end of the run (after the changes and the data plane).
	RSSSteadyMiB  float64 `json:"rssSteadyMiB"`
	RSSPeakMiB    float64 `json:"rssPeakMiB"`
	RSSEndMiB     float64 `json:"rssEndMiB"`
	RSSPeakEndMiB float64 `json:"rssPeakEndMiB"`
	CPUEnd        float64 `json:"cpuEnd"`
	// Per endpoint change (one at a time): the sync time it caused
	// (sum of the kubeproxy_sync_proxy_rules_duration_seconds samples
	// until the change was programmed) and its network programming
	// latency (kubeproxy_network_programming_duration_seconds: from the
	// EndpointSlice's last-change-trigger-time to the rules).
	ChangeSync []float64 `json:"changeSyncSeconds"`
	NPL        []float64 `json:"networkProgrammingSeconds"`
	DataPlane  []Probe   `json:"dataPlane,omitempty"`
}

// apiCluster is a control plane holding one generated cluster.
type apiCluster struct {
	cp     *framework.ControlPlane
	client kubernetes.Interface
	c      *cluster.Cluster
}

// startAPICluster starts etcd and kube-apiserver and creates c's objects,
// with a client allowed to go as fast as the API server.
func startAPICluster(tb *TB, c *cluster.Cluster) *apiCluster {
	cp := framework.Start(tb, framework.Options{APIServerArgs: []string{"--service-node-port-range=" + cluster.NodePortRange}})
	cfg := *cp.Config
	cfg.QPS, cfg.Burst = 5000, 5000
	client, err := kubernetes.NewForConfig(&cfg)
	if err != nil {
		tb.Fatal(err)
	}
	a := &apiCluster{cp: cp, client: client, c: c}
	ctx, cancel := context.WithTimeout(tb.Context(), 30*time.Minute)
	defer cancel()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.Opts.Namespace}}, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
	start := time.Now()
	objs := c.Objects()
	var created atomic.Int64
	stop := make(chan struct{})
	defer close(stop)
	go func() { // progress: a 10k-service cluster takes minutes
		t := time.NewTicker(15 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				tb.Logf("  created %d of %d objects", created.Load(), len(objs))
			}
		}
	}()
	if err := a.parallel(ctx, objs, func(ctx context.Context, o any) error {
		defer created.Add(1)
		return a.create(ctx, o)
	}); err != nil {
		tb.Fatalf("creating the cluster: %v", err)
	}
	tb.Logf("created %d nodes, %d services, %d endpoint slices (%d endpoints) in %s", len(c.Nodes), len(c.Services), len(c.Slices), c.Endpoints(), time.Since(start).Round(time.Second))
	return a
}

// parallel runs f on objs with 16 workers, nodes and services before
// slices (the order of objs).
func (a *apiCluster) parallel(ctx context.Context, objs []any, f func(context.Context, any) error) error {
	const workers = 16
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(objs); i += workers {
				if err := f(ctx, objs[i]); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func (a *apiCluster) create(ctx context.Context, o any) error {
	switch o := o.(type) {
	case *v1.Node:
		n := o.DeepCopy()
		created, err := a.client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		created.Status = n.Status
		_, err = a.client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
		return err
	case *v1.Service:
		s := o.DeepCopy()
		created, err := a.client.CoreV1().Services(s.Namespace).Create(ctx, s, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("service %s: %w", s.Name, err)
		}
		if len(s.Status.LoadBalancer.Ingress) > 0 {
			created.Status = s.Status
			if _, err := a.client.CoreV1().Services(s.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("service %s status: %w", s.Name, err)
			}
		}
		return nil
	case *discovery.EndpointSlice:
		s := o.DeepCopy()
		if _, err := a.client.DiscoveryV1().EndpointSlices(s.Namespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("endpoint slice %s: %w", s.Name, err)
		}
		return nil
	}
	return fmt.Errorf("cannot create %T", o)
}

// update writes a changed slice with the trigger time the EndpointSlice
// controller would set (the start of network programming latency).
func (a *apiCluster) update(ctx context.Context, o any) error {
	s, ok := o.(*discovery.EndpointSlice)
	if !ok {
		return fmt.Errorf("cannot update %T", o)
	}
	s = s.DeepCopy()
	s.ResourceVersion = ""
	s.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: time.Now().UTC().Format(time.RFC3339Nano)}
	_, err := a.client.DiscoveryV1().EndpointSlices(s.Namespace).Update(ctx, s, metav1.UpdateOptions{})
	return err
}

// runAPI runs proxy p in mode against the API server once.
func (a *apiCluster) runAPI(tb *TB, p Proxy, mode string, rep, changes int, gap time.Duration, dataPlane bool) APIResult {
	c := a.c
	res := APIResult{Services: len(c.Services), Endpoints: c.Endpoints(), Mix: string(c.Opts.Mix), Proxy: p.Name, Mode: mode, Rep: rep}
	ns, proc, fs := a.startProxy(tb, p, mode, "kpe2e-bapi")
	res.TimeToFirstSync, res.FirstSyncSeconds, res.CPUToFirstSync = fs.TimeTo, fs.Seconds, fs.CPU
	time.Sleep(wait(5 * time.Second))
	res.RSSSteadyMiB = procStatusMiB(proc.Pid(), "VmRSS")
	res.RSSPeakMiB = procStatusMiB(proc.Pid(), "VmHWM")
	tb.Logf("  %s %s: first sync %.2f s after start (the sync itself %.2f s), %.1f CPU s, RSS %.0f MiB (peak %.0f)",
		p.Name, mode, res.TimeToFirstSync, res.FirstSyncSeconds, res.CPUToFirstSync, res.RSSSteadyMiB, res.RSSPeakMiB)

	client := framework.HTTPClientIn(ns)
	for k := range changes {
		tb.Check()
		before, err := scrape(tb.Context(), client, metricsURL)
		if err != nil {
			tb.Fatalf("metrics: %v", err)
		}
		ch := c.FlipReady()
		ctx, cancel := context.WithTimeout(tb.Context(), 30*time.Second)
		err = a.update(ctx, ch.Update[0])
		cancel()
		if err != nil {
			tb.Fatalf("change %d: %v", k, err)
		}
		deadline := time.Now().Add(30 * time.Second)
		done := false
		for !done && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
			m, err := scrape(tb.Context(), client, metricsURL)
			if err != nil {
				continue
			}
			// Upstream observes the latency inside its sync and the
			// sync's duration after it: wait for both.
			if n := m.Sum(mNPL+"_count") - before.Sum(mNPL+"_count"); n > 0 && m.Sum(mSync+"_count") > before.Sum(mSync+"_count") {
				res.NPL = append(res.NPL, (m.Sum(mNPL+"_sum")-before.Sum(mNPL+"_sum"))/n)
				res.ChangeSync = append(res.ChangeSync, m.Sum(mSync+"_sum")-before.Sum(mSync+"_sum"))
				done = true
			}
		}
		if !done {
			tb.Logf("  %s %s: change %d (%s) not programmed within 30 s by the metrics", p.Name, mode, k, ch.Name)
		}
		// By default past the min sync period (1 s, from the end of the
		// last sync) and kproxy's clean-up sync a second after a
		// change's: each change meets a proxy at rest.
		if gap <= 0 {
			gap = wait(3 * time.Second)
		}
		time.Sleep(gap)
	}
	if dataPlane {
		res.DataPlane = measureDataPlane(tb, ns, c)
	}
	res.RSSEndMiB = procStatusMiB(proc.Pid(), "VmRSS")
	res.RSSPeakEndMiB = procStatusMiB(proc.Pid(), "VmHWM")
	res.CPUEnd = cpuSeconds(proc.Pid())
	stopProxy(tb, p, proc, "the run")
	return res
}

// startProxy starts proxy p in mode against the API server, in a new
// node namespace named from prefix that reaches the control plane, and
// waits for its first sync (15 minutes at most).
func (a *apiCluster) startProxy(tb *TB, p Proxy, mode, prefix string, extra ...string) (string, *framework.Process, firstSync) {
	ns := framework.AddNamespace(tb, prefix)
	a.cp.ConnectNamespace(tb, ns)
	argv, err := p.argv(tb, mode, a.c.LocalNode().Name, 2, append([]string{"--kubeconfig", a.cp.Kubeconfig(tb, "system:kube-proxy")}, extra...)...)
	if err != nil {
		tb.Fatal(err)
	}
	started := time.Now()
	proc := framework.StartProcess(tb, ns, logDirFor(tb), p.Name, argv...)
	// Every family: the first to finish says nothing of the next (kproxy
	// syncs them in any order; at 10k IPv6 took 0.1 s, IPv4 4 s after).
	return ns, proc, waitFirstSync(tb, ns, proc, started, 15*time.Minute, hostFamilies())
}

// stopProxy fails the scope if proc already exited during what (its log's
// last lines say why), and stops it otherwise.
func stopProxy(tb *TB, p Proxy, proc *framework.Process, what string) {
	select {
	case <-proc.Done():
		tb.Fatalf("%s exited during %s: %v\n%s", p.Name, what, proc.ExitError(), proc.Tail(30))
	default:
	}
	if err := proc.Stop(); err != nil {
		tb.Logf("stopping %s: %v", p.Name, err)
	}
}
