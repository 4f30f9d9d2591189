package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/spf13/pflag"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/idlemem"
	"github.com/kproxy/kproxy/internal/kernel/nft/nfnetlink"
	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/ipvs"
	"github.com/kproxy/kproxy/internal/proxy/nftables"
	"github.com/kproxy/kproxy/internal/proxy/nodeports"
	"github.com/kproxy/kproxy/internal/server"
	"github.com/kproxy/kproxy/internal/source"
	"github.com/kproxy/kproxy/internal/source/apiserver"
	"github.com/kproxy/kproxy/internal/source/file"
)

// nodeHealth forwards this node's object to the health server as well.
type nodeHealth struct {
	model.EventHandler
	health *server.ProxyHealth
	name   string
}

func (n nodeHealth) NodeUpdated(node *v1.Node) {
	if node.Name == n.name {
		n.health.SyncNode(node)
	}
	n.EventHandler.NodeUpdated(node)
}

func (n nodeHealth) NodeDeleted(node *v1.Node) {
	if node.Name == n.name {
		n.health.SyncNode(nil)
	}
	n.EventHandler.NodeDeleted(node)
}

var _ model.EventHandler = nodeHealth{}

// runProxy runs the proxy until ctx ends.
func runProxy(ctx context.Context, o *config.Options, flags *pflag.FlagSet, fromFile string, compact bool) error {
	c := o.Config
	mode := config.EffectiveMode(c)
	node, err := config.Hostname(c)
	if err != nil {
		return err
	}
	// As upstream after validation: kubernetes_feature_enabled, and
	// client-go reads the configured gates.
	gates, err := config.ApplyFeatureGates(c)
	if err != nil {
		return err
	}
	if o.CleanupAndExit {
		return cleanup(ctx)
	}
	if err := checkSupported(c, mode); err != nil {
		return usageError{err}
	}
	fams := config.Families(c, config.IPv6Available())
	// Kernel settings first, as upstream's platformSetup: iptables mode
	// reads nf_conntrack_tcp_be_liberal when it builds its rules.
	if err := initSteps(ctx, c, mode, node, fams, o.InitAndExit, hostInitEnv()); err != nil {
		return err
	}
	if o.InitAndExit {
		klog.InfoS("System initialized and --init-only specified")
		return nil
	}
	applyOOMScoreAdj(c, "/proc/self/oom_score_adj")
	errc := make(chan error, 4)
	if o.ConfigFile != "" {
		if err := config.WatchFile(ctx, o.ConfigFile, errc); err != nil {
			return err
		}
	}
	var backends map[v1.IPFamily]proxy.Backend
	backendName := ""
	// after removes the previous mode's rules once kproxy's are in place.
	var after *proxy.AfterFirstSync
	// nftables mode: the adapters whose sockets are kproxy's own (drift).
	var nls []*nfnetlink.Netlink
	var gens *nfnetlink.Generations
	switch mode {
	case config.ModeNFTables:
		s, err := setUpNFTablesMode(c, fams)
		if err != nil {
			return err
		}
		klog.InfoS(s.logLine(), "node", node, "ipFamilies", fams, "tables", s.tables)
		backends, backendName, after, nls, gens = s.backends, "nftables", s.after, s.nls, s.gens
	case config.ModeIPTables:
		s, err := setUpIPTablesMode(ctx, o, fams, node, iptablesEnv{compact: compact})
		if err != nil {
			return err
		}
		klog.InfoS(s.logLine(), "node", node, "backend", s.backend, "reason", s.reason, "ipFamilies", s.families)
		fams, backends, backendName, after = s.families, s.backends, string(s.backend), s.after
	case config.ModeIPVS:
		s, err := setUpIPVSMode(ctx, o, fams, node, ipvsEnv{})
		if err != nil {
			return err
		}
		defer s.close()
		klog.InfoS(s.logLine(), "node", node, "backend", s.backend, "reason", s.reason, "ipFamilies", s.families, "scheduler", ipvs.Scheduler(c))
		klog.ErrorS(nil, ipvsDeprecation)
		fams, backends, backendName, after = s.families, s.backends, string(s.backend), s.after
	default:
		return usageError{fmt.Errorf("--proxy-mode %s is not available in this kproxy build; use --proxy-mode nftables, iptables or ipvs", mode)}
	}
	metrics.SetInfo(mode, backendName, version)
	metrics.SetBuildInfo(versionInfo())

	syncPeriod, minSyncPeriod := config.SyncPeriods(c)
	// nftables and iptables modes notice drift by themselves: their
	// periodic sync is partial and the full one hourly, as upstream's.
	// ipvs mode has no drift check: every periodic sync is full.
	var fullSyncPeriod time.Duration
	if mode != config.ModeIPVS {
		fullSyncPeriod = proxy.DefaultFullSyncPeriod
	}
	clk := clock.RealClock{}
	health := server.NewProxyHealth(2*syncPeriod, clk)

	var loop *proxy.Loop
	var recorder events.EventRecorder
	tracker := model.NewTracker(model.TrackerOptions{
		Hostname: node,
		Families: fams,
		OnChange: func() {
			if loop != nil {
				loop.Changed()
			}
		},
	})
	svcHealth := server.NewServiceHealthServer(node, nil, health, server.DefaultListen)
	// As upstream's /configz: the defaulted values (mode, nodePortAddresses).
	configz := config.Configz(c)
	svcHealth.SetAddresses(func() []netip.Addr {
		return nodeports.HealthCheckAddrs(configz.NodePortAddresses, c.BindAddress, fams, tracker.Node(), proxy.LocalAddrs)
	})
	defer svcHealth.Close()
	// What a sync leaves on the heap is returned to the system once
	// kproxy is idle (package idlemem).
	idle := idlemem.New(idlemem.DefaultQuiet, nil)
	go idle.Run(ctx)
	loop = proxy.New(proxy.Options{
		Tracker:        tracker,
		Backends:       backends,
		SyncPeriod:     syncPeriod,
		FullSyncPeriod: fullSyncPeriod,
		Clock:          clk,
		Health:         health,
		Services:       svcHealth,
		MinSyncPeriod:  minSyncPeriod,
		RetryInterval:  retryInterval(syncPeriod),
		// nftables mode: a table and a netlink socket per family. Not
		// iptables mode: the legacy backend's restores of both families
		// queue for one xtables lock (-w 5, a bounded wait that a long
		// restore of the other family could exceed). Not ipvs mode: the
		// families share kube-ipvs0, IPVS and its ipsets.
		ParallelFamilies: mode == config.ModeNFTables,
		BeforeSync:       func(context.Context) { idle.Begin() },
		AfterSync: func(ctx context.Context) {
			after.Run(ctx)
			idle.End()
		},
		OnRefused: func(f v1.IPFamily, name model.ServicePortName, err error) {
			if recorder == nil {
				return
			}
			ref := &v1.ObjectReference{Kind: "Service", APIVersion: "v1", Namespace: name.Namespace, Name: name.Name}
			recorder.Eventf(ref, nil, v1.EventTypeWarning, "FailedToProgram", "SyncProxyRules",
				"The kernel refused the %s rules of port %q/%s on node %s; the port is left out and retried later: %v", f, name.Port, name.Protocol, node, err)
		},
	})
	stopDrift := watchDrift(ctx, mode, loop, nftDrift{nls: nls, gens: gens, after: after}, fams, syncPeriod, idle)
	defer stopDrift()

	src, client, err := newSource(o, fromFile, node, health)
	if err != nil {
		return err
	}
	// Events as upstream records them (component kube-proxy, through the
	// events.k8s.io API): about this node at start (events.go), and for
	// refused service ports.
	recorder, nodeEv, stopEvents := setUpEvents(ctx, client, c, node)
	defer stopEvents()

	go func() {
		err := server.NewHealthzServer(server.HealthzServerConfig{
			BindAddress: c.HealthzBindAddress, BindAddressHardFail: c.BindAddressHardFail, Health: health, Clock: clk,
		}).Run(ctx)
		nodeEv.serverFailed(reasonFailedHealthzServer, err)
		errc <- err
	}()
	go func() {
		err := server.NewMetricsServer(withZpages(server.MetricsServerConfig{
			BindAddress: c.MetricsBindAddress, BindAddressHardFail: c.BindAddressHardFail,
			ProxyMode: func() string { return mode }, ProxyBackend: func() string { return backendName }, Configz: func() any { return configz },
			EnableProfiling: c.EnableProfiling, Clock: clk,
		}, gates, flags)).Run(ctx)
		nodeEv.serverFailed(reasonFailedMetricsServer, err)
		errc <- err
	}()
	go func() {
		errc <- src.Run(ctx, nodeHealth{EventHandler: tracker, health: health, name: node})
	}()
	nodeEv.starting()
	go loop.Run(ctx)

	select {
	case <-ctx.Done():
		klog.InfoS("Shutting down; rules stay in place")
		return nil
	case err := <-errc:
		if err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		<-ctx.Done()
		return nil
	}
}

// nftDrift is what nftables mode's drift monitor needs: the adapters,
// whose sockets are kproxy's own, their commit count, and when the first
// sync of every family succeeded.
type nftDrift struct {
	nls   []*nfnetlink.Netlink
	gens  *nfnetlink.Generations
	after *proxy.AfterFirstSync
}

// watchDrift starts what notices rules changed behind kproxy's back:
// nf_tables notifications in nftables mode, a scheduled comparison of
// iptables-save with what kproxy wrote in iptables mode. Either repairs
// through loop.Repair. The returned function releases the listener.
//
// nftables mode listens only once the first sync of every family has
// succeeded (the kernel builds a notification per object kproxy commits
// while anyone listens), then repairs every family if anything else
// committed meanwhile (nftables.DriftWatch.Gap).
func watchDrift(ctx context.Context, mode string, loop *proxy.Loop, nd nftDrift, fams []v1.IPFamily, syncPeriod time.Duration, idle *idlemem.Releaser) func() {
	switch mode {
	case config.ModeNFTables:
		ctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			select {
			case <-ctx.Done():
				return
			case <-nd.after.Synced():
			}
			watchNFTables(ctx, loop, nd, fams)
		}()
		return func() { cancel(); <-done }
	case config.ModeIPTables:
		go loop.CheckBackendDrifts(ctx, "iptables", idle, proxy.DriftCheckOptions{Min: driftCheckMin, Max: syncPeriod, CostFactor: 10})
	}
	return func() {}
}

// driftRepairer is what the nftables drift monitor asks for repairs
// (*proxy.Loop).
type driftRepairer interface {
	Repair(v1.IPFamily)
	RepairTables(v1.IPFamily, []string)
}

// watchNFTables subscribes to nf_tables notifications (in the namespace
// opts name, the process's by default) and repairs what others change
// until ctx ends.
func watchNFTables(ctx context.Context, loop driftRepairer, nd nftDrift, fams []v1.IPFamily, opts ...nfnetlink.NetlinkOption) {
	mon, err := nfnetlink.NewMonitor(opts...)
	if err != nil {
		klog.ErrorS(err, "Cannot listen to nf_tables notifications; rules changed by others are repaired only at the next full sync, hourly")
		return
	}
	defer func() { _ = mon.Close() }()
	own := func(port uint32) bool {
		for _, n := range nd.nls {
			if n.OwnPort(port) {
				return true
			}
		}
		return false
	}
	mon.SkipPorts(own)
	w := &nftables.DriftWatch{
		Watcher:      mon,
		Families:     fams,
		Repair:       loop.Repair,
		RepairTables: loop.RepairTables,
		Own:          own,
		Gap:          func(ctx context.Context) (bool, error) { return nd.gens.Foreign(ctx, nd.nls[0]) },
	}
	if err := w.Run(ctx); err != nil {
		klog.ErrorS(err, "Stopped listening to nf_tables notifications; rules changed by others are repaired only at the next full sync")
	}
}

// driftCheckMin is the shortest pause between two comparisons of the
// iptables rules with what kproxy wrote (longer when they are slow: 10
// times what the last one took, at most the sync period).
const driftCheckMin = time.Second

// retryInterval: a failed sync is retried soon, but not in a hot loop.
func retryInterval(syncPeriod time.Duration) time.Duration {
	return min(5*time.Second, syncPeriod)
}

// newSource returns where cluster state comes from, and the API client
// when it is the API server.
func newSource(o *config.Options, fromFile, node string, health *server.ProxyHealth) (source.Source, kubernetes.Interface, error) {
	if fromFile != "" {
		klog.InfoS("Reading cluster state from a file instead of the API server", "path", fromFile)
		// A broken file keeps its last good objects; /healthz turns
		// 503 when that lasts the health timeout.
		return file.New(fromFile, file.Options{OnProblem: health.SourceProblem}), nil, nil
	}
	client, err := apiserver.NewClient(o.Kubeconfig, o.Master, o.Config.ClientConnection)
	if err != nil {
		return nil, nil, fmt.Errorf("connecting to the API server: %w", err)
	}
	return apiserver.New(client, node, o.Config.ConfigSyncPeriod.Duration), client, nil
}
