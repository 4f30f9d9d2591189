package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"

	"github.com/kproxy/kproxy/internal/kernel/ipset"
	"github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/kernel/netdev"
	"github.com/kproxy/kproxy/internal/proxy"
)

// LoadIPVS makes sure this kernel has IPVS, loading module ip_vs when it
// is missing: moby/ipvs opens without complaint on a kernel without it.
func LoadIPVS(ctx context.Context) error {
	if _, err := os.Stat("/proc/sys/net/ipv4/vs"); err != nil {
		_ = exec.CommandContext(ctx, "modprobe", "ip_vs").Run()
		if _, err := os.Stat("/proc/sys/net/ipv4/vs"); err != nil {
			return fmt.Errorf("can't use the IPVS proxier: this kernel has no IPVS (module ip_vs not loaded and cannot be loaded): %w", err)
		}
	}
	return nil
}

// OpenHandles opens IPVS, ipset and rtnetlink in the network namespace
// at path netns ("" this one): the Handles of one proxier but IPTables,
// Conntrack and LocalAddrs. release closes them.
func OpenHandles(netns string) (h Handles, release func(), err error) {
	vs, err := ipvs.NewHandle(netns)
	if err != nil {
		return Handles{}, nil, fmt.Errorf("opening IPVS: %w", err)
	}
	sets, err := ipset.NewHandle(netns)
	if err != nil {
		vs.Close()
		return Handles{}, nil, fmt.Errorf("opening ipset (module ip_set): %w", err)
	}
	dev, err := netdev.NewHandle(netns)
	if err != nil {
		vs.Close()
		sets.Close()
		return Handles{}, nil, fmt.Errorf("opening rtnetlink: %w", err)
	}
	return Handles{IPVS: vs, IPSet: sets, NetDev: dev}, func() { vs.Close(); sets.Close(); dev.Close() }, nil
}

// NodeAddrs lists the node's addresses on every interface but kube-ipvs0
// (Handles.LocalAddrs).
func NodeAddrs() ([]netip.Addr, error) { return proxy.LocalAddrsExcept(DummyDevice) }
