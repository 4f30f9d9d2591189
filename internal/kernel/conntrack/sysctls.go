package conntrack

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/kube-proxy/config/v1alpha1"
	"k8s.io/utils/cpuset"

	"github.com/kproxy/kproxy/internal/kernel/sysctl"
)

// The conntrack parameters kube-proxy sets at start. See
// https://docs.kernel.org/networking/nf_conntrack-sysctl.html.
const (
	// MaxPath is global: in a network namespace other than the initial one
	// the file is read-only and shows the global value.
	MaxPath = "/proc/sys/net/netfilter/nf_conntrack_max"
	// HashsizePath is a module parameter, global as well.
	HashsizePath = "/sys/module/nf_conntrack/parameters/hashsize"
	// The timeouts and be_liberal are per network namespace.
	TCPEstablishedTimeoutPath = "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established"
	TCPCloseWaitTimeoutPath   = "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait"
	TCPBeLiberalPath          = "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal"
	UDPTimeoutPath            = "/proc/sys/net/netfilter/nf_conntrack_udp_timeout"
	UDPStreamTimeoutPath      = "/proc/sys/net/netfilter/nf_conntrack_udp_timeout_stream"
)

// maxLimit caps maxPerCore × CPUs, as upstream does, so that a machine
// with many cores does not reserve memory for millions of entries.
const maxLimit = 1 << 20

// NumCPU is the CPU count nf_conntrack_max is scaled with: the node's online
// CPUs, not the process's cpuset (the limit is for the whole node), as
// upstream.
func NumCPU() int {
	if n, err := cpuset.NumCPU(); err == nil && n > 0 {
		return n
	}
	return runtime.NumCPU()
}

// SetSysctls applies the conntrack section of the configuration as
// upstream's pkg/proxy/conntrack.SetSysctls does: a zero (or unset) value
// leaves the kernel's value as it is; nf_conntrack_max is only ever raised
// (to maxPerCore × numCPU, at least min, at most 2^20), and the hash table
// is grown to a quarter of it when smaller; a value already in place is not
// written again. The first failure stops and is returned.
func SetSysctls(ctx context.Context, sys sysctl.Interface, c *v1alpha1.KubeProxyConntrackConfiguration, numCPU int) error {
	logger := klog.FromContext(ctx)
	if max := Max(c, numCPU); max > 0 {
		if cur, err := sys.Get(MaxPath); err != nil || cur < max {
			logger.Info("Set sysctl", "entry", MaxPath, "value", max)
			if err := sys.Set(MaxPath, max); err != nil {
				return fmt.Errorf("raising nf_conntrack_max to %d (conntrack.maxPerCore × %d CPUs, at least conntrack.min): %w", max, numCPU, err)
			}
		}
		hashsize, err := sys.Get(HashsizePath)
		if err != nil {
			return fmt.Errorf("reading the conntrack hash size: %w", err)
		}
		if hashsize < max/4 {
			logger.Info("Setting conntrack hashsize", "conntrackHashsize", max/4)
			if err := sys.Set(HashsizePath, max/4); err != nil {
				return fmt.Errorf("growing the conntrack hash table to %d for nf_conntrack_max %d: %w", max/4, max, err)
			}
		}
	}
	type setting struct {
		path  string
		value int
		field string
	}
	var settings []setting
	if d := c.TCPEstablishedTimeout; d != nil && d.Duration > 0 {
		settings = append(settings, setting{TCPEstablishedTimeoutPath, int(d.Duration / time.Second), "conntrack.tcpEstablishedTimeout"})
	}
	if d := c.TCPCloseWaitTimeout; d != nil && d.Duration > 0 {
		settings = append(settings, setting{TCPCloseWaitTimeoutPath, int(d.Duration / time.Second), "conntrack.tcpCloseWaitTimeout"})
	}
	if c.TCPBeLiberal {
		settings = append(settings, setting{TCPBeLiberalPath, 1, "conntrack.tcpBeLiberal"})
	}
	if c.UDPTimeout.Duration > 0 {
		settings = append(settings, setting{UDPTimeoutPath, int(c.UDPTimeout.Duration / time.Second), "conntrack.udpTimeout"})
	}
	if c.UDPStreamTimeout.Duration > 0 {
		settings = append(settings, setting{UDPStreamTimeoutPath, int(c.UDPStreamTimeout.Duration / time.Second), "conntrack.udpStreamTimeout"})
	}
	for _, s := range settings {
		if cur, err := sys.Get(s.path); err == nil && cur == s.value {
			continue
		}
		logger.Info("Set sysctl", "entry", s.path, "value", s.value)
		if err := sys.Set(s.path, s.value); err != nil {
			return fmt.Errorf("applying %s: %w", s.field, err)
		}
	}
	return nil
}

// Max is the nf_conntrack_max kube-proxy wants, 0 for "leave it".
func Max(c *v1alpha1.KubeProxyConntrackConfiguration, numCPU int) int {
	if c.MaxPerCore == nil || *c.MaxPerCore <= 0 {
		return 0
	}
	floor := 0
	if c.Min != nil {
		floor = int(*c.Min)
	}
	scaled := int(*c.MaxPerCore) * numCPU
	if scaled > maxLimit {
		return maxLimit
	}
	return max(scaled, floor)
}
