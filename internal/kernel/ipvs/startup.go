package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/kernel/sysctl"
)

// Schedulers are the IPVS schedulers ipvs mode takes: the Linux kernel's
// (the module of each is ip_vs_<name>), as config validation and Render
// take them. Upstream passes any name to the kernel; whether the module
// exists is the kernel's answer (twos is in Linux 6.2 and later only).
var Schedulers = []string{"rr", "wrr", "lc", "wlc", "fo", "ovf", "lblc", "lblcr", "dh", "sh", "mh", "sed", "nq", "twos"}

// DefaultScheduler is used when none is configured.
const DefaultScheduler = "rr"

// probeService is the virtual server CheckScheduler adds and deletes
// again, as upstream's CanUseIPVSProxier: TEST-NET-2 (RFC 5737), which no
// service should use.
var probeService = VirtualServer{Protocol: syscall.IPPROTO_TCP, Addr: netip.MustParseAddr("198.51.100.0"), Port: 20000}

// CheckScheduler makes sure the kernel can schedule with name ("" is
// DefaultScheduler): a virtual server using it exists, or a probe virtual
// server (198.51.100.0:20000/TCP, as upstream's) can be added with it,
// which loads ip_vs_<name>. The error names the scheduler and its module.
func CheckScheduler(h Handle, name string) error {
	if name == "" {
		name = DefaultScheduler
	}
	if !slices.Contains(Schedulers, name) {
		return fmt.Errorf("ipvs scheduler %q is unknown (one of %s)", name, strings.Join(Schedulers, ", "))
	}
	svcs, err := h.Services()
	if err != nil {
		return fmt.Errorf("ipvs scheduler %q: %w", name, err)
	}
	for _, s := range svcs {
		if s.Scheduler == name {
			return nil
		}
		if s.VirtualServer.Protocol == probeService.Protocol && s.Addr == probeService.Addr && s.Port == probeService.Port {
			// Left by a check that died: delete it below.
			if err := h.DeleteService(s.VirtualServer); err != nil {
				return fmt.Errorf("ipvs scheduler %q: deleting a leftover probe: %w", name, err)
			}
		}
	}
	err = h.AddService(Service{VirtualServer: probeService, Scheduler: name})
	if errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("ipvs scheduler %q: the kernel has no such scheduler and cannot load its module ip_vs_%s (modprobe ip_vs_%s): %w", name, name, name, err)
	}
	if err != nil {
		return fmt.Errorf("ipvs scheduler %q: adding the probe virtual server %v: %w", name, probeService, err)
	}
	if err := h.DeleteService(probeService); err != nil {
		return fmt.Errorf("ipvs scheduler %q: deleting the probe virtual server %v: %w", name, probeService, err)
	}
	return nil
}

// Sysctls upstream's ipvs mode sets (paths under /proc/sys).
const (
	SysctlVSConntrack                = "/proc/sys/net/ipv4/vs/conntrack"
	SysctlConnReuseMode              = "/proc/sys/net/ipv4/vs/conn_reuse_mode"
	SysctlExpireNoDestConn           = "/proc/sys/net/ipv4/vs/expire_nodest_conn"
	SysctlExpireQuiescentTemplate    = "/proc/sys/net/ipv4/vs/expire_quiescent_template"
	SysctlIPForward                  = "/proc/sys/net/ipv4/ip_forward"
	SysctlArpIgnore                  = "/proc/sys/net/ipv4/conf/all/arp_ignore"
	SysctlArpAnnounce                = "/proc/sys/net/ipv4/conf/all/arp_announce"
	connReuseModeFixedKernel         = "5.9" // upstream: conn_reuse_mode left alone from here
	connReuseModeMinSupportedKernels = "4.1"
)

// EnsureSysctls sets what upstream's ipvs mode sets at start, each only
// when it differs: vs/conntrack=1 (IPVS connections get conntrack entries,
// for masquerading), vs/expire_nodest_conn=1, vs/expire_quiescent_template=1,
// ip_forward=1, vs/conn_reuse_mode=0 on kernels 4.1 to 5.8 (later ones
// fixed it and are left alone), and with strictARP arp_ignore=1 and
// arp_announce=2 on all interfaces (so kube-ipvs0's addresses are not
// announced). kernelRelease is uname's ("" reads it). The vs/* sysctls
// exist once ip_vs is loaded (NewHandle loads it).
func EnsureSysctls(s sysctl.Interface, strictARP bool, kernelRelease string) error {
	if kernelRelease == "" {
		var u unix.Utsname
		if err := unix.Uname(&u); err != nil {
			return fmt.Errorf("reading the kernel release: %w", err)
		}
		kernelRelease = unix.ByteSliceToString(u.Release[:])
	}
	type setting struct {
		path string
		v    int
	}
	want := []setting{{SysctlVSConntrack, 1}}
	switch {
	case kernelAtLeast(kernelRelease, connReuseModeFixedKernel):
	case kernelAtLeast(kernelRelease, connReuseModeMinSupportedKernels):
		want = append(want, setting{SysctlConnReuseMode, 0})
	default:
		klog.ErrorS(nil, "Can't set sysctl, kernel version doesn't satisfy minimum version requirements", "sysctl", SysctlConnReuseMode, "minimumKernelVersion", connReuseModeMinSupportedKernels)
	}
	want = append(want, setting{SysctlExpireNoDestConn, 1}, setting{SysctlExpireQuiescentTemplate, 1}, setting{SysctlIPForward, 1})
	if strictARP {
		want = append(want, setting{SysctlArpIgnore, 1}, setting{SysctlArpAnnounce, 2})
	}
	for _, w := range want {
		old, err := s.Get(w.path)
		if err == nil && old == w.v {
			continue
		}
		if err := s.Set(w.path, w.v); err != nil {
			return fmt.Errorf("ipvs mode: %w", err)
		}
		klog.V(1).InfoS("Changed sysctl", "name", w.path, "before", old, "after", w.v)
	}
	return nil
}

// kernelAtLeast compares a release ("6.1.0-28-amd64") with "major.minor".
func kernelAtLeast(release, min string) bool {
	parse := func(s string) (int, int) {
		s, _, _ = strings.Cut(s, "-")
		f := strings.SplitN(s, ".", 3)
		maj, _ := strconv.Atoi(f[0])
		mnr := 0
		if len(f) > 1 {
			mnr, _ = strconv.Atoi(f[1])
		}
		return maj, mnr
	}
	a, b := parse(release)
	c, d := parse(min)
	return a > c || a == c && b >= d
}
