package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/kernel/conntrack"
	"github.com/kproxy/kproxy/internal/kernel/sysctl"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/iptables"
)

// The start-up steps upstream kube-proxy takes before it creates its
// proxier (newProxyServer's platformSetup, and the parts of the proxiers'
// constructors that --init-only runs), and the process settings of its Run.

// initEnv is where the init steps write; tests point it at a fake.
type initEnv struct {
	sys    sysctl.Interface
	numCPU int
}

func hostInitEnv() initEnv { return initEnv{sys: sysctl.Files{}, numCPU: conntrack.NumCPU()} }

// checkSupported refuses what kproxy accepts in the configuration but does
// not implement, instead of silently doing nothing.
// It runs before anything touches the kernel.
func checkSupported(c *v1alpha1.KubeProxyConfiguration, mode string) error {
	switch mode {
	case config.ModeIPTables, config.ModeIPVS:
		// ipvs: the KubeProxyIPVS feature gate is checked by validation,
		// as upstream's.
		return nil
	case config.ModeNFTables:
	default:
		return fmt.Errorf("--proxy-mode %s is not available in this kproxy build; use --proxy-mode nftables, iptables or ipvs", mode)
	}
	fg, err := config.NewFeatureGate(c)
	if err != nil {
		return err
	}
	if fg.Enabled(config.KubeProxyNFTablesLocalhostNodePorts) {
		// Upstream v1.37 serves TCP node ports on loopback in nftables
		// mode through a userspace proxy (pkg/proxy/localnodeportproxy)
		// and rejects the rest; kproxy has neither.
		return fmt.Errorf("feature gate %s is not implemented by kproxy: node ports on loopback addresses are not served in nftables mode; disable the gate, or use --proxy-mode iptables (iptables.localhostNodePorts) for node ports on 127.0.0.1", config.KubeProxyNFTablesLocalhostNodePorts)
	}
	return nil
}

// initSteps applies the kernel settings upstream applies at start: the
// conntrack section (always), and in iptables mode route_localnet for node
// ports on 127.0.0.1 when initOnly (otherwise setUpIPTablesMode does it
// just before the proxier is built, as upstream's NewProxier).
func initSteps(ctx context.Context, c *v1alpha1.KubeProxyConfiguration, mode, node string, fams []v1.IPFamily, initOnly bool, env initEnv) error {
	if err := conntrack.SetSysctls(ctx, env.sys, &c.Conntrack, env.numCPU); err != nil {
		return fmt.Errorf("could not set conntrack parameters from kube-proxy configuration: %w", err)
	}
	if initOnly && mode == config.ModeIPTables && slices.Contains(fams, model.IPv4) {
		opts := iptables.NewOptions(c, model.IPv4, node)
		if opts.NeedsRouteLocalnet() {
			if err := ensureRouteLocalnet(env.sys); err != nil {
				return err
			}
		}
	}
	return nil
}

// ensureRouteLocalnet sets net.ipv4.conf.all.route_localnet=1 for node
// ports on 127.0.0.1. It writes only when the value is not 1 yet, as
// upstream's EnsureSysctl: after an --init-only run, /proc/sys may be
// read-only in the proxy's container.
func ensureRouteLocalnet(sys sysctl.Interface) error {
	const routeLocalnet = "/proc/sys/net/ipv4/conf/all/route_localnet"
	if v, err := sys.Get(routeLocalnet); err == nil && v == 1 {
		return nil
	}
	if err := sys.Set(routeLocalnet, 1); err != nil {
		return fmt.Errorf("localhost node ports need net.ipv4.conf.all.route_localnet=1 (or set iptables.localhostNodePorts: false): %w", err)
	}
	klog.InfoS("Set net.ipv4.conf.all.route_localnet=1 for node ports on 127.0.0.1 (iptables.localhostNodePorts)")
	return nil
}

// applyOOMScoreAdj sets the process's OOM score adjustment as upstream's
// ProxyServer.Run does; a failure is only logged (at -v=2, as upstream).
func applyOOMScoreAdj(c *v1alpha1.KubeProxyConfiguration, path string) {
	if c.OOMScoreAdj == nil {
		return
	}
	v := int(*c.OOMScoreAdj)
	// Upstream's OOMAdjuster retries a few times: the write can fail
	// transiently while the process is still being set up.
	var err error
	for range 3 {
		if err = os.WriteFile(path, []byte(strconv.Itoa(v)), 0o644); err == nil {
			klog.V(2).InfoS("Applied OOM score adjustment", "oomScoreAdj", v)
			return
		}
	}
	klog.V(2).InfoS("Failed to apply OOMScore", "err", err)
}
