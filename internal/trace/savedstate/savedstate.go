// Package savedstate reads what operators save of an ipvs mode node, for
// `kproxy trace --rules`: `ipvsadm -S -n` (or `ipvsadm -Ln`) for the IPVS
// table, `ipset save` for the ipsets, iptables-save for the rules. The
// three may come in separate files or one after the other in one file
// (as `kproxy render --proxy-mode ipvs` prints them): Split tells the
// lines apart, since no line of one format looks like a line of another.
package savedstate

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/ipset"
	"github.com/kproxy/kproxy/internal/trace"
)

// Parts are the three kinds of text of a saved node state.
type Parts struct {
	IPTables string // iptables-save or iptables-restore input
	IPVSAdm  string // ipvsadm -S -n or ipvsadm -Ln
	IPSet    string // ipset save
	// DummyAddrs are the addresses a "# kube-ipvs0: ..." comment of
	// kproxy render lists (local addresses of the node).
	DummyAddrs []netip.Addr
}

// Split sorts the lines of text by format. Comments and blank lines go
// with the iptables text (iptables-restore skips them), except render's
// "# kube-ipvs0:" line.
func Split(text string) (Parts, error) {
	var p Parts
	var ipt, adm, set strings.Builder
	created := map[string]bool{}
	for n, line := range strings.Split(text, "\n") {
		t := strings.TrimSpace(line)
		f := strings.Fields(t)
		switch {
		case strings.HasPrefix(t, "# kube-ipvs0:"):
			for _, a := range f[2:] {
				addr, err := netip.ParseAddr(a)
				if err != nil {
					return p, fmt.Errorf("line %d: %w", n+1, err)
				}
				p.DummyAddrs = append(p.DummyAddrs, addr)
			}
		case isIPVSAdmLine(f):
			adm.WriteString(t + "\n")
		case len(f) >= 3 && f[0] == "create" && isSetType(f[2]):
			created[f[1]] = true
			set.WriteString(t + "\n")
		case len(f) >= 3 && f[0] == "add" && created[f[1]]:
			// nft text has "add table ...": a set's members follow
			// its create line in ipset save.
			set.WriteString(t + "\n")
		default:
			ipt.WriteString(line + "\n")
		}
	}
	p.IPTables, p.IPVSAdm, p.IPSet = ipt.String(), adm.String(), set.String()
	return p, nil
}

func isSetType(t string) bool {
	return strings.HasPrefix(t, "hash:") || strings.HasPrefix(t, "bitmap:") || strings.HasPrefix(t, "list:")
}

var serviceOpts = map[string]v1.Protocol{
	"-t": v1.ProtocolTCP, "--tcp-service": v1.ProtocolTCP,
	"-u": v1.ProtocolUDP, "--udp-service": v1.ProtocolUDP,
	"--sctp-service": v1.ProtocolSCTP,
	"-f":             "", "--fwmark-service": "",
}

func isIPVSAdmLine(f []string) bool {
	if len(f) == 0 {
		return false
	}
	switch f[0] {
	case "-A", "-a":
		// iptables' -A is followed by a chain name, never an option.
		if len(f) > 1 {
			_, ok := serviceOpts[f[1]]
			return ok
		}
	case "TCP", "UDP", "SCTP", "FWM":
		return len(f) >= 3
	case "->":
		return true
	case "IP":
		return len(f) >= 3 && f[1] == "Virtual" && f[2] == "Server"
	case "Prot":
		return true
	}
	return false
}

// ParseIPVSAdm reads `ipvsadm -S -n` or `ipvsadm -Ln` output (the -S
// form is what `ipvsadm -R` restores). Firewall-mark services are
// skipped (kube-proxy makes none; the tracer does not model them).
func ParseIPVSAdm(text string) ([]trace.IPVSService, error) {
	var out []trace.IPVSService
	idx := map[string]int{} // "TCP 1.2.3.4:80" -> index in out
	cur := -1               // -Ln: the service the "->" lines belong to
	fwm := false
	for n, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		errf := savedLine{"ipvsadm", n + 1, line}.errorf
		switch f[0] {
		case "IP", "Prot":
			continue
		case "-A", "-a":
			if len(f) < 3 {
				return nil, errf("too short")
			}
			proto, ok := serviceOpts[f[1]]
			if !ok {
				return nil, errf("unknown service option %s", f[1])
			}
			if proto == "" {
				continue // firewall mark
			}
			addr, err := parseAddrPort(f[2])
			if err != nil {
				return nil, errf("%v", err)
			}
			key := string(proto) + " " + addr.String()
			if f[0] == "-A" {
				if _, dup := idx[key]; dup {
					return nil, errf("virtual server given twice")
				}
				svc := trace.IPVSService{Proto: proto, Addr: addr, Scheduler: "wlc"} // ipvsadm's default
				if err := serviceOptions(&svc, f[3:]); err != nil {
					return nil, errf("%v", err)
				}
				idx[key] = len(out)
				out = append(out, svc)
				continue
			}
			i, ok := idx[key]
			if !ok {
				return nil, errf("real server of a virtual server not added before (-A)")
			}
			r, err := realOptions(f[3:])
			if err != nil {
				return nil, errf("%v", err)
			}
			out[i].Reals = append(out[i].Reals, r)
		case "TCP", "UDP", "SCTP", "FWM":
			fwm = f[0] == "FWM"
			if fwm {
				cur = -1
				continue
			}
			if len(f) < 3 {
				return nil, errf("too short")
			}
			addr, err := parseAddrPort(f[1])
			if err != nil {
				return nil, errf("%v", err)
			}
			proto := v1.Protocol(f[0])
			key := string(proto) + " " + addr.String()
			if _, dup := idx[key]; dup {
				return nil, errf("virtual server given twice")
			}
			svc := trace.IPVSService{Proto: proto, Addr: addr, Scheduler: f[2]}
			for i := 3; i < len(f); i++ {
				switch f[i] {
				case "persistent":
					if i+1 >= len(f) {
						return nil, errf("persistent without a timeout")
					}
					t, err := strconv.ParseUint(f[i+1], 10, 32)
					if err != nil {
						return nil, errf("persistent timeout %q", f[i+1])
					}
					svc.Persistent, svc.Timeout = true, uint32(t)
					i++
				case "mask":
					i++ // persistence netmask: not modelled
				default:
					svc.Flags = append(svc.Flags, strings.Trim(f[i], "()"))
				}
			}
			idx[key] = len(out)
			cur = len(out)
			out = append(out, svc)
		case "->":
			if fwm {
				continue
			}
			if len(f) >= 2 && f[1] == "RemoteAddress:Port" {
				continue // the header
			}
			if cur < 0 {
				return nil, errf("real server before any virtual server")
			}
			if len(f) < 4 {
				return nil, errf("too short")
			}
			addr, err := parseAddrPort(f[1])
			if err != nil {
				return nil, errf("%v", err)
			}
			w, err := strconv.Atoi(f[3])
			if err != nil {
				return nil, errf("weight %q", f[3])
			}
			method := map[string]string{"Masq": "masq", "Local": "masq", "Route": "route", "Tunnel": "tunnel"}[f[2]]
			if method == "" {
				return nil, errf("forwarding method %q", f[2])
			}
			out[cur].Reals = append(out[cur].Reals, trace.IPVSReal{Addr: addr, Weight: w, Method: method})
		default:
			return nil, errf("not ipvsadm -S or -Ln output")
		}
	}
	return out, nil
}

// savedLine is a line of a saved-state file, for its parse errors:
// `ipvsadm line 3 "-A -t ...": too short`.
type savedLine struct {
	what string
	n    int
	text string
}

func (l savedLine) errorf(format string, args ...any) error {
	return fmt.Errorf("%s line %d %q: %s", l.what, l.n, strings.TrimSpace(l.text), fmt.Sprintf(format, args...))
}

// nextArg is the argument of option f[*i]: it moves *i on to it.
func nextArg(f []string, i *int) (string, error) {
	if *i+1 >= len(f) {
		return "", fmt.Errorf("%s needs an argument", f[*i])
	}
	*i++
	return f[*i], nil
}

func serviceOptions(svc *trace.IPVSService, f []string) error {
	for i := 0; i < len(f); i++ {
		switch f[i] {
		case "-s", "--scheduler":
			v, err := nextArg(f, &i)
			if err != nil {
				return err
			}
			svc.Scheduler = v
		case "-p", "--persistent":
			svc.Persistent, svc.Timeout = true, 300 // ipvsadm's default
			if i+1 < len(f) && !strings.HasPrefix(f[i+1], "-") {
				t, err := strconv.ParseUint(f[i+1], 10, 32)
				if err != nil {
					return fmt.Errorf("persistent timeout %q", f[i+1])
				}
				svc.Timeout = uint32(t)
				i++
			}
		case "-b", "--sched-flags":
			v, err := nextArg(f, &i)
			if err != nil {
				return err
			}
			svc.Flags = append(svc.Flags, strings.Split(v, ",")...)
		case "-M", "--netmask", "--pe":
			if _, err := nextArg(f, &i); err != nil {
				return err
			}
		case "-o", "--ops":
			svc.Flags = append(svc.Flags, "ops")
		default:
			return fmt.Errorf("unknown option %s", f[i])
		}
	}
	return nil
}

func realOptions(f []string) (trace.IPVSReal, error) {
	r := trace.IPVSReal{Weight: 1, Method: "route"} // ipvsadm's defaults
	seen := false
	for i := 0; i < len(f); i++ {
		switch f[i] {
		case "-r", "--real-server":
			v, err := nextArg(f, &i)
			if err != nil {
				return r, err
			}
			if r.Addr, err = parseAddrPort(v); err != nil {
				return r, err
			}
			seen = true
		case "-w", "--weight":
			v, err := nextArg(f, &i)
			if err != nil {
				return r, err
			}
			if r.Weight, err = strconv.Atoi(v); err != nil || r.Weight < 0 {
				return r, fmt.Errorf("weight %q", v)
			}
		case "-m", "--masquerading":
			r.Method = "masq"
		case "-g", "--gatewaying":
			r.Method = "route"
		case "-i", "--ipip":
			r.Method = "tunnel"
		case "-x", "--u-threshold", "-y", "--l-threshold", "--tun-type", "--tun-port":
			if _, err := nextArg(f, &i); err != nil {
				return r, err
			}
		case "--tun-nocsum", "--tun-csum", "--tun-remcsum":
		default:
			return r, fmt.Errorf("unknown option %s", f[i])
		}
	}
	if !seen {
		return r, errors.New("no -r real server")
	}
	return r, nil
}

// parseAddrPort reads "1.2.3.4:80" and "[fd00::1]:80".
func parseAddrPort(s string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return ap, fmt.Errorf("address %q: want IP:PORT or [IPv6]:PORT (ipvsadm -n)", s)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

// ParseIPSetSave reads `ipset save` output: "create NAME TYPE [family
// inet|inet6] [options]" and "add NAME ENTRY [options]". Entries are
// checked against their set's type and family.
func ParseIPSetSave(text string) (map[string]*trace.IPSet, error) {
	sets := map[string]*trace.IPSet{}
	for n, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		errf := savedLine{"ipset save", n + 1, line}.errorf
		if len(f) < 3 {
			return nil, errf("too short")
		}
		switch f[0] {
		case "create":
			if sets[f[1]] != nil {
				return nil, errf("set created twice")
			}
			s := &trace.IPSet{Name: f[1], Type: f[2]}
			for i := 3; i+1 < len(f); i++ {
				if f[i] == "family" {
					switch f[i+1] {
					case "inet6":
						s.IPv6 = true
					case "inet":
					default:
						return nil, errf("family %q", f[i+1])
					}
				}
			}
			sets[s.Name] = s
		case "add":
			s := sets[f[1]]
			if s == nil {
				return nil, errf("add to a set not created before")
			}
			for _, opt := range f[3:] {
				if opt == "nomatch" {
					return nil, errf("nomatch entries are not modelled")
				}
			}
			if _, err := ipset.ParseEntry(s.Type, s.IPv6, f[2]); err != nil {
				return nil, errf("%v", err)
			}
			s.Entries = append(s.Entries, f[2])
		default:
			return nil, errf("not ipset save output")
		}
	}
	return sets, nil
}
