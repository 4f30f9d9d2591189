package doctor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/nft/nfnetlink"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/proxy/nftables"
)

// hostFacts is what doctor reads from this host: nothing is changed.
type hostFacts struct {
	// Chosen and ChosenWhy: the iptables backend kproxy's iptables mode
	// would use here, and why (ChooseErr when it could not choose).
	Chosen    xtables.Backend
	ChosenWhy string
	ChooseErr error
	// Versions of the installed iptables backends ("" or Missing).
	Versions map[xtables.Backend]string
	Missing  map[xtables.Backend]error
	// KubeChains are kube-proxy's chains per backend ("IPv4 nat/KUBE-SERVICES").
	KubeChains map[xtables.Backend][]string
	// ForeignRules are rules in kube-proxy's chains that kube-proxy would
	// not have written, per backend ("IPv4 nat: -A KUBE-SERVICES ...").
	ForeignRules map[xtables.Backend][]string
	// NFTables: nf_tables usable (NFTErr if not), and the nftables mode's
	// tables by family ("ip kube-proxy", "ip kube-proxy-s0", ...).
	NFTErr   error
	NFTables []string
	// IPVS leftovers (IPVSErr when they could not be read).
	IPVS    ipvs.Leftovers
	IPVSErr error
	// IPVSNode is ipvs mode's kernel state (ipvs.go).
	IPVSNode ipvsFacts
	// Sysctls by path under /proc/sys ("" when unreadable).
	Sysctls map[string]string
	// Running: what a kproxy or kube-proxy on this node answers on
	// /proxyMode ("" when nothing answers) and the backend header.
	RunningMode, RunningBackend string
	// RunningProblems are the running kproxy's metrics that say a service
	// is not programmed as written (contested addresses, refused service
	// ports), "metric{labels} value" per series above zero.
	RunningProblems []string
	// Mode is the configured proxy mode; IPTablesModeEnv is IPTABLES_MODE.
	Mode, IPTablesModeEnv string
	// Foreign are the other netfilter users (netfilter.go).
	Foreign foreignUsers
}

// finding is one line of doctor's verdict.
type finding struct {
	Level string // "ok", "warn" or "error"
	Text  string
}

const (
	levelOK    = "ok"
	levelWarn  = "warn"
	levelError = "error"
)

// doctorSysctls are the sysctls doctor reports.
var doctorSysctls = []string{
	"net/ipv4/ip_forward",
	"net/ipv4/conf/all/route_localnet",
	"net/bridge/bridge-nf-call-iptables",
	"net/netfilter/nf_conntrack_max",
	"net/netfilter/nf_conntrack_tcp_be_liberal",
	"net/ipv4/vs/conntrack",
}

// Options are what doctor is told: the configuration the node's proxy
// runs with and where that proxy answers.
type Options struct {
	// Config is the effective configuration (flags and --config).
	Config *v1alpha1.KubeProxyConfiguration
	// IPTablesMode is IPTABLES_MODE ("" when unset).
	IPTablesMode string
	// MetricsURL is where a running kproxy or kube-proxy serves
	// /proxyMode and /metrics ("" asks nothing).
	MetricsURL string
}

// ErrFound is returned by Run when the report holds an error.
var ErrFound = errors.New("doctor found errors (see above)")

// Run reads this host (it changes nothing), writes the report to out and
// returns ErrFound when a finding is an error.
func Run(ctx context.Context, out io.Writer, o Options) error {
	facts := gatherFacts(ctx, o.IPTablesMode, o.MetricsURL)
	facts.Mode, facts.IPTablesModeEnv = config.EffectiveMode(o.Config), o.IPTablesMode
	facts.IPVSNode = gatherIPVS(o.Config, facts.IPVS)
	findings := diagnose(facts)
	printFacts(out, facts, findings)
	for _, f := range findings {
		if f.Level == levelError {
			return ErrFound
		}
	}
	return nil
}

// gatherFacts reads the host. Every part is best effort: what cannot be
// read is recorded as such, never fatal.
func gatherFacts(ctx context.Context, iptablesMode, metricsURL string) hostFacts {
	f := hostFacts{
		Versions:     map[xtables.Backend]string{},
		Missing:      map[xtables.Backend]error{},
		KubeChains:   map[xtables.Backend][]string{},
		ForeignRules: map[xtables.Backend][]string{},
		Sysctls:      map[string]string{},
	}
	f.Chosen, f.ChosenWhy, f.ChooseErr = xtables.Select(ctx, iptablesMode)
	for _, b := range xtables.Backends {
		ipt, err := xtables.New(b, xtables.IPv4)
		if err == nil {
			f.Versions[b], err = ipt.Version(ctx)
		}
		if err != nil {
			f.Missing[b] = err
			continue
		}
		for _, fam := range xtables.Families {
			chains, err := xtables.FindLeftovers(ctx, b, fam)
			if err != nil {
				continue
			}
			for _, c := range chains {
				f.KubeChains[b] = append(f.KubeChains[b], string(fam)+" "+c.String())
			}
			foreign, err := xtables.FindForeignRules(ctx, b, fam)
			if err != nil {
				continue
			}
			for _, r := range foreign {
				f.ForeignRules[b] = append(f.ForeignRules[b], string(fam)+" "+r.String())
			}
		}
	}
	if iface, err := nfnetlink.NewNetlink(); err != nil {
		f.NFTErr = err
	} else {
		for _, fam := range []nft.Family{nft.IPv4, nft.IPv6} {
			tables, err := iface.ListTables(ctx, fam)
			if err != nil {
				f.NFTErr = err
				break
			}
			for _, t := range nftables.OurTables(nftables.DefaultTableName, tables) {
				f.NFTables = append(f.NFTables, string(fam)+" "+t)
			}
		}
		_ = iface.Close()
	}
	f.Foreign = gatherForeign(ctx)
	f.IPVS, f.IPVSErr = ipvs.FindLeftovers(ctx)
	for _, s := range doctorSysctls {
		if b, err := os.ReadFile("/proc/sys/" + s); err == nil {
			f.Sysctls[s] = strings.TrimSpace(string(b))
		}
	}
	if metricsURL != "" {
		f.RunningMode, f.RunningBackend = proxyModeOf(ctx, metricsURL)
		if f.RunningMode != "" {
			f.RunningProblems = problemMetrics(ctx, metricsURL)
		}
	}
	return f
}

// proxyModeOf asks a running proxy for its mode; "" when none answers.
func proxyModeOf(ctx context.Context, base string) (mode, backend string) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(base, "/")+"/proxyMode", nil)
	if err != nil {
		return "", ""
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	if resp.StatusCode != http.StatusOK {
		return "", ""
	}
	return strings.TrimSpace(string(body)), resp.Header.Get("X-Kproxy-Backend")
}

// problemSeries are the metrics of a running kproxy that doctor reports
// when above zero: each is a service not programmed as its object says.
var problemSeries = []string{"kproxy_contested_addresses", "kproxy_refused_service_ports"}

// problemMetrics reads the running proxy's /metrics for problemSeries.
func problemMetrics(ctx context.Context, base string) []string {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(base, "/")+"/metrics", nil)
	if err != nil {
		return nil
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	return problemLines(string(body))
}

// problemLines picks the problemSeries lines with a value above zero out
// of a Prometheus text exposition.
func problemLines(body string) []string {
	var out []string
	for _, line := range strings.Split(body, "\n") {
		name, _, _ := strings.Cut(line, "{")
		if !slices.Contains(problemSeries, name) {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil && v > 0 {
			out = append(out, line)
		}
	}
	return out
}

// diagnose turns facts into findings. Pure: tested without a host.
func diagnose(f hostFacts) []finding {
	var out []finding
	add := func(level, format string, args ...any) {
		out = append(out, finding{level, fmt.Sprintf(format, args...)})
	}
	legacy, nftBackend := len(f.KubeChains[xtables.Legacy]) > 0, len(f.KubeChains[xtables.NFT]) > 0
	ipvsLeft := f.IPVSErr == nil && !f.IPVS.Empty()
	nftMode := len(f.NFTables) > 0

	if legacy && nftBackend {
		add(levelError, "kube-proxy rules in BOTH iptables backends (legacy: %d chains, nft: %d): both run on every packet, legacy first; the stale ones misroute service traffic. Stop the proxy, run `kproxy --cleanup`, start one proxy with IPTABLES_MODE set", len(f.KubeChains[xtables.Legacy]), len(f.KubeChains[xtables.NFT]))
	}
	for _, b := range xtables.Backends {
		if rules := notIPVSModes(f, b); len(rules) > 0 {
			add(levelError, "%d rules in kube-proxy's chains of the %s backend that kube-proxy does not write (another program's, or injected): they can redirect or open service traffic. First: %s. A full sync of the proxy rewrites these chains; find what writes them", len(rules), b, rules[0])
		}
	}
	modes := 0
	iptablesMode := legacy || nftBackend
	if ipvsRunning(f) {
		// ipvs mode's own chains are kube-proxy chains of its backend.
		iptablesMode = len(f.KubeChains[ipvsBackend(f).Other()]) > 0
	}
	for _, on := range []bool{iptablesMode, nftMode, ipvsLeft} {
		if on {
			modes++
		}
	}
	if modes > 1 {
		var which []string
		if iptablesMode {
			which = append(which, "iptables")
		}
		if nftMode {
			which = append(which, "nftables")
		}
		if ipvsLeft {
			which = append(which, "ipvs")
		}
		add(levelWarn, "rules of several proxy modes at once (%s): stale rules after a mode switch. kproxy removes the other modes' rules once its own first sync is done (upstream kube-proxy when it starts); if they stay, `kproxy --cleanup` with the proxy stopped removes them all", strings.Join(which, ", "))
	}
	if f.RunningMode != "" {
		running := f.RunningMode
		if f.RunningBackend != "" {
			running += " (backend " + f.RunningBackend + ")"
		}
		add(levelOK, "a proxy answers on /proxyMode: %s", running)
		for _, p := range f.RunningProblems {
			add(levelWarn, "the running proxy reports %s: services not programmed as written (contested addresses: another service holds the address, see `kproxy render` and the proxy's log; refused ports: the kernel refused their rules, see the log)", p)
		}
		switch {
		case f.RunningMode == config.ModeNFTables && (legacy || nftBackend):
			add(levelWarn, "the running proxy is in nftables mode but kube-proxy iptables rules exist: they run before or beside its tables")
		case f.RunningMode == config.ModeIPTables && nftMode:
			add(levelWarn, "the running proxy is in iptables mode but the nftables mode's tables exist (%s)", strings.Join(f.NFTables, ", "))
		case f.RunningMode == config.ModeIPTables && f.RunningBackend != "":
			other := xtables.Backend(f.RunningBackend).Other()
			if len(f.KubeChains[other]) > 0 {
				add(levelError, "the running proxy uses the %s backend but the %s backend holds kube-proxy chains", f.RunningBackend, other)
			}
		}
	} else {
		add(levelOK, "no proxy answers on /proxyMode (or it listens elsewhere: --metrics-url)")
	}
	if f.ChooseErr != nil {
		add(levelError, "iptables mode could not choose a backend: %v", f.ChooseErr)
	} else {
		add(levelOK, "iptables mode would use the %s backend (%s)", f.Chosen, f.ChosenWhy)
	}
	for _, b := range xtables.Backends {
		if err := f.Missing[b]; err != nil {
			level := levelOK
			if b == f.Chosen || errors.Is(err, xtables.ErrUnsupportedVersion) {
				level = levelWarn
			}
			add(level, "iptables %s backend not usable: %v", b, err)
		}
	}
	if f.NFTErr != nil {
		add(levelWarn, "nf_tables not usable (nftables mode and iptables-nft need it): %v", f.NFTErr)
	}
	mode, backend := f.Mode, f.Chosen
	if f.RunningMode != "" {
		mode = f.RunningMode
		if f.RunningBackend != "" {
			backend = xtables.Backend(f.RunningBackend)
		}
	}
	diagnoseForeign(f.Foreign, mode, backend, f.IPTablesModeEnv, add)
	diagnoseIPVS(f, mode, add)
	if v, ok := f.Sysctls["net/ipv4/ip_forward"]; ok && v != "1" {
		add(levelError, "net.ipv4.ip_forward=%s: the node does not forward, so traffic to pods on other nodes and from outside dies (the CNI or kubelet normally sets it)", v)
	}
	return out
}

// printFacts writes the report: facts first, then the findings.
func printFacts(w io.Writer, f hostFacts, findings []finding) {
	p := func(format string, args ...any) { _, _ = fmt.Fprintf(w, format+"\n", args...) }
	p("iptables backends:")
	for _, b := range xtables.Backends {
		state := f.Versions[b]
		if err := f.Missing[b]; err != nil {
			state = "not usable"
		}
		p("  %-6s %-10s kube-proxy chains: %d%s", b, state, len(f.KubeChains[b]), sample(f.KubeChains[b]))
	}
	p("nftables mode tables: %s", listOrNone(f.NFTables))
	printForeign(p, f.Foreign)
	// On a node that runs ipvs mode these objects are its own, not leftovers.
	ipvsWhat := "IPVS leftovers"
	if ipvsRunning(f) {
		ipvsWhat = "ipvs mode's objects (in use)"
	}
	switch {
	case f.IPVSErr != nil:
		p("IPVS: cannot tell (%v)", f.IPVSErr)
	case f.IPVS.Empty():
		p("%s: none", ipvsWhat)
	default:
		p("%s: interface %q, %d ipsets, %d virtual servers", ipvsWhat, f.IPVS.Link, len(f.IPVS.IPSets), len(f.IPVS.VirtualServers))
	}
	printIPVS(p, f.IPVSNode)
	keys := make([]string, 0, len(f.Sysctls))
	for k := range f.Sysctls {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	p("sysctls:")
	for _, k := range keys {
		p("  %s = %s", strings.ReplaceAll(k, "/", "."), f.Sysctls[k])
	}
	p("")
	for _, fd := range findings {
		p("%-5s %s", strings.ToUpper(fd.Level), fd.Text)
	}
}

func sample(chains []string) string {
	if len(chains) == 0 {
		return ""
	}
	n := min(3, len(chains))
	s := " (" + strings.Join(chains[:n], ", ")
	if len(chains) > n {
		s += fmt.Sprintf(", and %d more", len(chains)-n)
	}
	return s + ")"
}

func listOrNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}
