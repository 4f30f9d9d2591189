package ipvs

import (
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/kernel/ipvs"
)

// Text prints a Desired in the forms operators know: the virtual and
// real servers as `ipvsadm -S -n` writes them, the sets as `ipset save`
// does, then the iptables-restore input. kube-ipvs0's addresses come
// first, as comments.
func (d *Desired) Text() string {
	var b strings.Builder
	b.WriteString("# " + DummyDevice + ":")
	for _, a := range d.Addresses {
		b.WriteString(" " + a.String())
	}
	b.WriteString("\n# ipvsadm -S -n\n")
	for _, vs := range d.Sorted() {
		svc := serviceArg(vs.VirtualServer)
		b.WriteString("-A " + svc + " -s " + vs.Scheduler)
		if vs.Flags&FlagSourceHash != 0 {
			b.WriteString(" -b sh-port")
		}
		if vs.Flags&ipvs.FlagPersistent != 0 {
			b.WriteString(" -p " + strconv.FormatUint(uint64(vs.Timeout), 10))
		}
		b.WriteString("\n")
		for _, rs := range vs.Reals {
			b.WriteString("-a " + svc + " -r " + hostPort(rs.Addr.String(), rs.Port, rs.Addr.Is6()) + " -m -w " + strconv.Itoa(rs.Weight) + "\n")
		}
	}
	b.WriteString("# ipset save\n")
	for _, s := range d.SortedSets() {
		b.WriteString("create " + s.Name + " " + s.Type)
		switch {
		case s.Type == typeBitmapPort:
			b.WriteString(" range 0-65535")
		case s.IPv6:
			b.WriteString(" family inet6")
		default:
			b.WriteString(" family inet")
		}
		b.WriteString(` comment "` + s.Comment + `"` + "\n")
		for _, e := range s.Entries {
			b.WriteString("add " + s.Name + " " + e + "\n")
		}
	}
	b.WriteString("# iptables-restore --noflush\n")
	b.Write(d.IPTables)
	return b.String()
}

func hostPort(host string, port uint16, v6 bool) string {
	if v6 {
		host = "[" + host + "]"
	}
	return host + ":" + strconv.Itoa(int(port))
}

// serviceArg is ipvsadm's service argument ("-t 198.19.0.1:80").
func serviceArg(v ipvs.VirtualServer) string {
	opt := "-t"
	switch v.Protocol {
	case unix.IPPROTO_UDP:
		opt = "-u"
	case unix.IPPROTO_SCTP:
		opt = "--sctp-service"
	}
	return opt + " " + hostPort(v.Addr.String(), v.Port, v.Addr.Is6())
}
