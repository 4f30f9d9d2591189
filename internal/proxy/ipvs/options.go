package ipvs

import (
	"fmt"
	"net/netip"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/kernel/ipvs"
)

// Options are the settings of one family's ipvs proxier, taken from the
// KubeProxyConfiguration once at start.
type Options struct {
	// Config is what Render is configured with; its Family is the
	// proxier's.
	Config
	// ExcludeCIDRs (ipvs.excludeCIDRs): virtual servers in them are never
	// deleted, whoever made them.
	ExcludeCIDRs []netip.Prefix
	// NodePortMin, NodePortMax bound the ports a virtual server on a node
	// address must have to count as kproxy's (a NodePort one); 0: the
	// Kubernetes default range 30000-32767.
	NodePortMin, NodePortMax uint16
	// GracePeriod bounds how long a removed TCP real server is kept at
	// weight 0 while it still has connections; 0: DefaultGracePeriod.
	GracePeriod time.Duration
	// Timeouts are IPVS's connection timeouts (tcpTimeout, tcpFinTimeout,
	// udpTimeout), set once at the first sync; zero values are left alone.
	Timeouts ipvs.Timeouts
}

// NewOptions derives one family's options from the configuration, for
// the proxy and `kproxy render` alike; hostname is the node's name. It
// fails on an ipvs.excludeCIDRs entry that is no CIDR (validation
// refuses those already; this says which, should one slip through).
func NewOptions(c *v1alpha1.KubeProxyConfiguration, family v1.IPFamily, hostname string) (Options, error) {
	o := Options{
		Config: Config{
			Family:            family,
			NodeName:          hostname,
			Scheduler:         c.IPVS.Scheduler,
			MasqueradeBit:     int(config.MasqueradeBit(c)),
			MasqueradeAll:     config.MasqueradeAll(c),
			LocalDetect:       config.LocalDetect(c, family),
			NodeIPs:           config.BindNodeIPs(c, family),
			NodePortAddresses: c.NodePortAddresses,
		},
		Timeouts: Timeouts(c),
	}
	var excludes []netip.Prefix
	for _, s := range c.IPVS.ExcludeCIDRs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return Options{}, fmt.Errorf("ipvs.excludeCIDRs: %q: %w", s, err)
		}
		excludes = append(excludes, p.Masked())
	}
	o.ExcludeCIDRs = config.OfFamily(excludes, family)
	return o, nil
}

// Timeouts are the configured IPVS connection timeouts (0: leave the
// kernel's).
func Timeouts(c *v1alpha1.KubeProxyConfiguration) ipvs.Timeouts {
	return ipvs.Timeouts{
		TCP:    uint32(c.IPVS.TCPTimeout.Duration / time.Second),
		TCPFin: uint32(c.IPVS.TCPFinTimeout.Duration / time.Second),
		UDP:    uint32(c.IPVS.UDPTimeout.Duration / time.Second),
	}
}

// Scheduler is the configured ipvs.scheduler, or DefaultScheduler.
func Scheduler(c *v1alpha1.KubeProxyConfiguration) string {
	if c.IPVS.Scheduler == "" {
		return DefaultScheduler
	}
	return c.IPVS.Scheduler
}
