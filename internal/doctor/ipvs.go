package doctor

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kproxy/kproxy/internal/config"
	kipvs "github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	ipvsmode "github.com/kproxy/kproxy/internal/proxy/ipvs"
)

// ipvsFacts are what doctor reads of ipvs mode's kernel state. Reading
// changes nothing: IPVS is only opened when its module is loaded already
// (asking generic netlink for it would load it).
type ipvsFacts struct {
	// Loaded: the kernel has IPVS now (ip_vs loaded or built in).
	Loaded bool
	// Err: the IPVS table could not be read.
	Err error
	// Dummy: kube-ipvs0 exists, with DummyAddrs addresses.
	Dummy      bool
	DummyAddrs int
	// Servers are every virtual server, kproxy's and others'.
	Servers []vsFact
	// Timeouts are IPVS's connection timeouts (TimeoutsErr if unread).
	Timeouts    kipvs.Timeouts
	TimeoutsErr error
	// Scheduler is the configured ipvs.scheduler (or the default).
	Scheduler string
	// Modules say, per scheduler of upstream's list, whether its module
	// ip_vs_<name> is "loaded", "built in", "available" (can be loaded)
	// or "missing".
	Modules map[string]string
	// Want are the configured timeouts (0: leave the kernel's).
	Want kipvs.Timeouts
}

// vsFact is one virtual server as doctor reports it.
type vsFact struct {
	Name      string // "TCP 198.19.0.10:80"
	Scheduler string
	Reals     int
	Terminate int // real servers of weight 0
	// Ours: kproxy's (or kube-proxy's) by the cleanup's rule: on an
	// address of kube-ipvs0 or KUBE-IPVS-IPS, or a NodePort on a node
	// address in the node port sets. Others are foreign and left alone.
	Ours bool
}

// Module states.
const (
	modLoaded    = "loaded"
	modBuiltin   = "built in"
	modAvailable = "available"
	modMissing   = "missing"
	modUnknown   = "unknown (no modules.dep for this kernel)"
)

// gatherIPVS reads ipvs mode's state; left are the IPVS leftovers doctor
// found already (they name kproxy's virtual servers).
func gatherIPVS(c *v1alpha1.KubeProxyConfiguration, left kipvs.Leftovers) ipvsFacts {
	f := ipvsFacts{Scheduler: ipvsmode.Scheduler(c), Loaded: left.IPVSChecked}
	f.Want = ipvsmode.Timeouts(c)
	if ifc, err := net.InterfaceByName(ipvsmode.DummyDevice); err == nil {
		f.Dummy = true
		if addrs, err := ifc.Addrs(); err == nil {
			f.DummyAddrs = len(addrs)
		}
	}
	var u unix.Utsname
	release := ""
	if unix.Uname(&u) == nil {
		release = unix.ByteSliceToString(u.Release[:])
	}
	f.Modules = schedulerModules("/", release)
	if !f.Loaded {
		return f
	}
	h, err := kipvs.NewHandle("")
	if err != nil {
		f.Err = err
		return f
	}
	defer h.Close()
	f.Timeouts, f.TimeoutsErr = kipvs.GetTimeouts(h)
	svcs, err := h.Services()
	if err != nil {
		f.Err = err
		return f
	}
	ours := map[kipvs.VirtualServer]bool{}
	for _, vs := range left.VirtualServers {
		ours[key4(vs)] = true
	}
	for _, s := range svcs {
		v := vsFact{Name: s.VirtualServer.String(), Scheduler: s.Scheduler, Ours: ours[key4(s.VirtualServer)]}
		if ds, err := h.Destinations(s.VirtualServer); err == nil {
			v.Reals = len(ds)
			for _, d := range ds {
				if d.Weight == 0 {
					v.Terminate++
				}
			}
		}
		f.Servers = append(f.Servers, v)
	}
	slices.SortFunc(f.Servers, func(a, b vsFact) int { return strings.Compare(a.Name, b.Name) })
	return f
}

// key4 compares virtual servers by protocol, address, port and mark only.
func key4(v kipvs.VirtualServer) kipvs.VirtualServer {
	return kipvs.VirtualServer{Protocol: v.Protocol, Addr: v.Addr.Unmap(), Port: v.Port, FWMark: v.FWMark}
}

// schedulerModules says for each scheduler whether the kernel under root
// ("/" but in tests) has its module: loaded (/sys/module), built in
// (modules.builtin) or loadable (modules.dep) for this release.
func schedulerModules(root, release string) map[string]string {
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(root, "lib/modules", release, name))
		if err != nil {
			return ""
		}
		return string(b)
	}
	builtin, dep := read("modules.builtin"), read("modules.dep")
	out := map[string]string{}
	for _, s := range kipvs.Schedulers {
		mod := "ip_vs_" + s
		file := "/" + mod + ".ko"
		switch {
		case exists(filepath.Join(root, "sys/module", mod)):
			out[s] = modLoaded
		case strings.Contains(builtin, file):
			out[s] = modBuiltin
		case strings.Contains(dep, file):
			out[s] = modAvailable
		case dep == "":
			out[s] = modUnknown
		default:
			out[s] = modMissing
		}
	}
	return out
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// diagnoseIPVS adds ipvs mode's findings; mode is the running or
// configured proxy mode.
func diagnoseIPVS(f hostFacts, mode string, add func(level, format string, args ...any)) {
	v := f.IPVSNode
	if v.Err != nil {
		add(levelWarn, "IPVS is loaded but its table could not be read: %v", v.Err)
	}
	if mode == config.ModeIPVS {
		switch st := v.Modules[v.Scheduler]; st {
		case modMissing:
			add(levelError, "ipvs.scheduler %q: this kernel has no module ip_vs_%s (not loaded, not built in, not in modules.dep): ipvs mode refuses to start", v.Scheduler, v.Scheduler)
		case "":
		case modUnknown:
			add(levelWarn, "ipvs.scheduler %q: module ip_vs_%s is not loaded and this kernel's module list cannot be read: cannot tell whether it loads", v.Scheduler, v.Scheduler)
		default:
			add(levelOK, "ipvs.scheduler %q: module ip_vs_%s %s", v.Scheduler, v.Scheduler, st)
		}
		if other := ipvsBackend(f).Other(); f.RunningMode == config.ModeIPVS && f.RunningBackend != "" && len(f.KubeChains[other]) > 0 {
			add(levelError, "the running proxy (ipvs mode) uses the %s backend but the %s backend holds kube-proxy chains", f.RunningBackend, other)
		}
		if f.RunningMode == config.ModeIPVS && !v.Dummy {
			add(levelWarn, "the running proxy is in ipvs mode but %s does not exist: service addresses are not local, ClusterIPs do not answer", ipvsmode.DummyDevice)
		}
		if s, ok := f.Sysctls["net/ipv4/vs/conntrack"]; ok && s != "1" {
			add(levelError, "net.ipv4.vs.conntrack=%s: IPVS connections get no conntrack entries, so masquerading (KUBE-POSTROUTING) never happens; ipvs mode sets it to 1 at start", s)
		}
		if v.TimeoutsErr == nil && v.Loaded {
			for _, t := range []struct {
				name       string
				have, want uint32
			}{{"tcpTimeout", v.Timeouts.TCP, v.Want.TCP}, {"tcpFinTimeout", v.Timeouts.TCPFin, v.Want.TCPFin}, {"udpTimeout", v.Timeouts.UDP, v.Want.UDP}} {
				if t.want != 0 && t.have != t.want {
					add(levelWarn, "IPVS %s is %ds, the configuration says %ds (ipvs mode sets it at its first sync; another program changed it, or the proxy has not synced)", t.name, t.have, t.want)
				}
			}
		}
	}
	ours, foreign := 0, 0
	for _, s := range v.Servers {
		if s.Ours {
			ours++
		} else {
			foreign++
		}
	}
	if foreign > 0 {
		add(levelOK, "%d IPVS virtual servers of another program (kproxy leaves them alone, also on --cleanup)", foreign)
	}
	if mode != config.ModeIPVS && f.IPVSErr == nil && !f.IPVS.Empty() {
		var what []string
		if f.IPVS.Link != "" {
			what = append(what, "interface "+f.IPVS.Link)
		}
		if n := len(f.IPVS.IPSets); n > 0 {
			what = append(what, fmt.Sprintf("%d ipsets (%s)", n, strings.Join(f.IPVS.IPSets[:min(3, n)], ", ")))
		}
		if n := len(f.IPVS.VirtualServers); n > 0 {
			what = append(what, fmt.Sprintf("%d virtual servers of kube-proxy's", n))
		}
		add(levelWarn, "ipvs mode's leftovers while the node runs %s mode: %s. Service addresses on %s stay local to this node and its virtual servers still answer them; kproxy removes them after its first sync, or `kproxy --cleanup` with the proxy stopped", mode, strings.Join(what, ", "), ipvsmode.DummyDevice)
	}
}

// printIPVS writes ipvs mode's facts.
func printIPVS(p func(string, ...any), v ipvsFacts) {
	switch {
	case !v.Loaded:
		p("IPVS: not loaded (module ip_vs)")
	case v.Err != nil:
		p("IPVS: cannot tell (%v)", v.Err)
	default:
		p("IPVS: %d virtual servers", len(v.Servers))
		for _, s := range v.Servers {
			owner := "foreign"
			if s.Ours {
				owner = "kube-proxy's"
			}
			term := ""
			if s.Terminate > 0 {
				term = fmt.Sprintf(", %d terminating (weight 0)", s.Terminate)
			}
			p("  %-40s %-5s %d real servers%s  %s", s.Name, s.Scheduler, s.Reals, term, owner)
		}
		if v.TimeoutsErr != nil {
			p("IPVS timeouts: cannot tell (%v)", v.TimeoutsErr)
		} else {
			p("IPVS timeouts: tcp %ds, tcpfin %ds, udp %ds", v.Timeouts.TCP, v.Timeouts.TCPFin, v.Timeouts.UDP)
		}
	}
	if v.Dummy {
		p("%s: present, %d addresses", ipvsmode.DummyDevice, v.DummyAddrs)
	} else {
		p("%s: absent", ipvsmode.DummyDevice)
	}
	var missing []string
	for _, s := range kipvs.Schedulers {
		if v.Modules[s] == modMissing {
			missing = append(missing, s)
		}
	}
	if len(missing) > 0 {
		p("IPVS schedulers without a module in this kernel: %s", strings.Join(missing, ", "))
	}
}

// ipvsRunning: the node runs ipvs mode (a proxy says so, or, with none
// answering, the configuration).
func ipvsRunning(f hostFacts) bool {
	if f.RunningMode != "" {
		return f.RunningMode == config.ModeIPVS
	}
	return f.Mode == config.ModeIPVS
}

// ipvsBackend is the iptables backend of ipvs mode's chains: the running
// proxy's, else the one iptables mode's choice would give.
func ipvsBackend(f hostFacts) xtables.Backend {
	if f.RunningBackend != "" {
		return xtables.Backend(f.RunningBackend)
	}
	return f.Chosen
}

// notIPVSModes drops, on an ipvs mode node, the rules of ipvs mode itself
// from the rules the foreign check (made for iptables mode's layout)
// flags in the backend ipvs mode writes: its loopback RETURN, its jump to
// KUBE-NODE-PORT and its ipset-matching rules (uncommented, or ACCEPT in
// nat KUBE-SERVICES), as internal/proxy/ipvs/render_iptables.go writes them. A rule
// that rewrites addresses is never ipvs mode's and stays flagged.
func notIPVSModes(f hostFacts, b xtables.Backend) []string {
	rules := f.ForeignRules[b]
	if !ipvsRunning(f) || b != ipvsBackend(f) {
		return rules
	}
	var out []string
	for _, r := range rules {
		ours := strings.Contains(r, " -m set --match-set KUBE-") ||
			strings.Contains(r, "-A KUBE-SERVICES -s 127.0.0.0/8 -j RETURN ") || strings.Contains(r, "-A KUBE-SERVICES -s ::1/128 -j RETURN ") ||
			strings.Contains(r, "-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT ")
		if ours && !strings.Contains(r, "-j DNAT") && !strings.Contains(r, "-j SNAT") && !strings.Contains(r, "-j REDIRECT") {
			continue
		}
		out = append(out, r)
	}
	return out
}
