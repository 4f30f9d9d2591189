// Package nfacct creates and reads the kernel's extended accounting
// objects (nfnetlink_acct, CONFIG_NETFILTER_NETLINK_ACCT): named packet and
// byte counters of a network namespace that iptables rules increment
// through the nfacct match (`-m nfacct --nfacct-name NAME`, xt_nfacct).
//
// Upstream kube-proxy's iptables mode counts two things this way and
// exports them as kubeproxy_iptables_ct_state_invalid_dropped_packets_total
// and kubeproxy_iptables_localhost_nodeports_accepted_packets_total; a rule
// naming a counter that does not exist is refused by the kernel (ENOENT),
// so the counters are created before the rules that use them.
//
// The wire format (linux/netfilter/nfnetlink_acct.h): messages of
// subsystem NFNL_SUBSYS_ACCT, an nfgenmsg header, then attributes; the
// counts are big-endian 64-bit.
package nfacct

import (
	"errors"
	"fmt"
	"time"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// MaxNameLen is the longest counter name the kernel takes (NFACCT_NAME_MAX
// is 32 with the terminating NUL).
const MaxNameLen = 31

// Message types and attributes of NFNL_SUBSYS_ACCT.
const (
	msgNew = 0 // NFNL_MSG_ACCT_NEW
	msgGet = 1 // NFNL_MSG_ACCT_GET

	attrName    = 1 // NFACCT_NAME: NUL-terminated string
	attrPackets = 2 // NFACCT_PKTS: __be64
	attrBytes   = 3 // NFACCT_BYTES: __be64
)

// timeout bounds one request, so that a stuck netlink call cannot hang a
// sync or a scrape.
const timeout = 2 * time.Second

// ErrNotFound is returned by Get for a counter that does not exist.
var ErrNotFound = errors.New("no such nfacct counter")

// Counter is one accounting object.
type Counter struct {
	Name    string
	Packets uint64
	Bytes   uint64
}

// Interface creates and reads counters.
type Interface interface {
	// Ensure creates the counter unless it exists (an existing one keeps
	// its counts).
	Ensure(name string) error
	// Get reads a counter; ErrNotFound when it does not exist.
	Get(name string) (Counter, error)
}

// Netlink talks to the kernel over nfnetlink, in the network namespace at
// NetNSPath ("" for the caller's).
type Netlink struct {
	NetNSPath string
}

var _ Interface = Netlink{}

// Ensure implements Interface.
func (n Netlink) Ensure(name string) error {
	if _, err := n.Get(name); !errors.Is(err, ErrNotFound) {
		return err
	}
	_, err := n.request(msgNew, unix.NLM_F_CREATE|unix.NLM_F_ACK, name)
	// EBUSY: created meanwhile by someone else (the kernel answers NEW for
	// an existing name without NLM_F_REPLACE so).
	if err != nil && !errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("creating nfacct counter %q: %w", name, err)
	}
	return nil
}

// Get implements Interface.
func (n Netlink) Get(name string) (Counter, error) {
	msgs, err := n.request(msgGet, unix.NLM_F_ACK, name)
	if errors.Is(err, unix.ENOENT) {
		return Counter{}, fmt.Errorf("nfacct counter %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return Counter{}, fmt.Errorf("reading nfacct counter %q: %w", name, err)
	}
	for _, m := range msgs {
		c, err := parseCounter(m)
		if err != nil {
			return Counter{}, fmt.Errorf("reading nfacct counter %q: %w", name, err)
		}
		if c.Name == name {
			return c, nil
		}
	}
	return Counter{}, fmt.Errorf("reading nfacct counter %q: the kernel's answer does not hold it", name)
}

func (n Netlink) request(msg uint16, flags int, name string) ([][]byte, error) {
	if name == "" || len(name) > MaxNameLen {
		return nil, fmt.Errorf("nfacct counter name %q: want 1 to %d bytes", name, MaxNameLen)
	}
	s, err := n.socket()
	if err != nil {
		return nil, err
	}
	defer s.Close()
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	if err := s.SetSendTimeout(&tv); err != nil {
		return nil, err
	}
	if err := s.SetReceiveTimeout(&tv); err != nil {
		return nil, err
	}
	req := nl.NewNetlinkRequest(unix.NFNL_SUBSYS_ACCT<<8|int(msg), flags)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_NETFILTER: {Socket: s}}
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_UNSPEC, Version: unix.NFNETLINK_V0})
	req.AddData(nl.NewRtAttr(attrName, nl.ZeroTerminated(name)))
	return req.Execute(unix.NETLINK_NETFILTER, 0)
}

func (n Netlink) socket() (*nl.NetlinkSocket, error) {
	if n.NetNSPath == "" {
		s, err := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_NETFILTER)
		if err != nil {
			return nil, fmt.Errorf("opening a netfilter netlink socket: %w", err)
		}
		return s, nil
	}
	ns, err := netns.GetFromPath(n.NetNSPath)
	if err != nil {
		return nil, fmt.Errorf("opening network namespace %s: %w", n.NetNSPath, err)
	}
	defer ns.Close()
	cur, err := netns.Get()
	if err != nil {
		return nil, err
	}
	defer cur.Close()
	s, err := nl.GetNetlinkSocketAt(ns, cur, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("opening a netfilter netlink socket in %s: %w", n.NetNSPath, err)
	}
	return s, nil
}

// parseCounter reads one NFNL_MSG_ACCT_NEW message (the answer to a GET):
// the nfgenmsg header, then attributes.
func parseCounter(b []byte) (Counter, error) {
	if len(b) < nl.SizeofNfgenmsg {
		return Counter{}, fmt.Errorf("message of %d bytes, shorter than its header", len(b))
	}
	attrs, err := nl.ParseRouteAttr(b[nl.SizeofNfgenmsg:])
	if err != nil {
		return Counter{}, err
	}
	var c Counter
	for _, a := range attrs {
		switch a.Attr.Type & nl.NLA_TYPE_MASK {
		case attrName:
			c.Name = unix.ByteSliceToString(a.Value)
		case attrPackets, attrBytes:
			if len(a.Value) != 8 {
				return Counter{}, fmt.Errorf("count attribute of %d bytes, want 8", len(a.Value))
			}
			v := uint64(0)
			for _, x := range a.Value {
				v = v<<8 | uint64(x)
			}
			if a.Attr.Type&nl.NLA_TYPE_MASK == attrPackets {
				c.Packets = v
			} else {
				c.Bytes = v
			}
		}
	}
	return c, nil
}

// Fake is an in-memory Interface for unit tests.
type Fake struct {
	Counters map[string]*Counter
	// EnsureErr, when set, is returned by Ensure (nothing is created).
	EnsureErr error
}

var _ Interface = (*Fake)(nil)

// Ensure implements Interface.
func (f *Fake) Ensure(name string) error {
	if f.EnsureErr != nil {
		return f.EnsureErr
	}
	if name == "" || len(name) > MaxNameLen {
		return fmt.Errorf("nfacct counter name %q: want 1 to %d bytes", name, MaxNameLen)
	}
	if f.Counters == nil {
		f.Counters = map[string]*Counter{}
	}
	if f.Counters[name] == nil {
		f.Counters[name] = &Counter{Name: name}
	}
	return nil
}

// Get implements Interface.
func (f *Fake) Get(name string) (Counter, error) {
	c := f.Counters[name]
	if c == nil {
		return Counter{}, fmt.Errorf("nfacct counter %q: %w", name, ErrNotFound)
	}
	return *c, nil
}
