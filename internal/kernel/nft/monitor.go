package nft

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/mdlayher/socket"
	"golang.org/x/sys/unix"
)

// This file listens to nf_tables change notifications: what `nft monitor`
// prints. nf_tables sends one message per changed object to the netlink
// multicast group NFNLGRP_NFTABLES when a transaction commits, each with
// the netlink port id of the socket that sent the transaction in its
// header (nlmsg_pid; ctx->portid in nf_tables_api.c). kproxy tells its own
// changes from others' by that port id (see Netlink.OwnPort).

// ObjKind is the kind of object a change notification is about.
type ObjKind string

// Kinds of objects (also the values of the kind label of
// kproxy_rules_drift_total).
const (
	KindTable   ObjKind = "table"
	KindChain   ObjKind = "chain"
	KindRule    ObjKind = "rule"
	KindSet     ObjKind = "set"
	KindMap     ObjKind = "map"
	KindElement ObjKind = "element"
	// KindUnknown: notifications were lost (the receive buffer
	// overflowed), so what changed is not known.
	KindUnknown ObjKind = "unknown"
)

// Event is one nf_tables change notification, or the news that some were
// lost.
type Event struct {
	// Lost: the kernel dropped notifications (ENOBUFS); the other fields
	// are empty and anything may have changed.
	Lost   bool
	Family Family // "ip", "ip6", "inet", "arp", "bridge", "netdev"
	Kind   ObjKind
	// Deleted: a deletion (DEL* message); otherwise an addition or
	// replacement (NEW* message).
	Deleted bool
	Table   string
	// Name is the object's name within the table: the chain (for rules
	// the chain they are in), the set or map (for elements the set they
	// are in). Empty for tables.
	Name string
	// Count is the number of objects: the elements of an element
	// notification, 1 otherwise.
	Count int
	// PortID is the netlink port id of the socket whose transaction
	// caused the change.
	PortID uint32
}

// Watcher delivers nf_tables change notifications. Monitor listens to the
// kernel; nfttest.Watcher is driven by tests.
type Watcher interface {
	// Watch calls fn with the events of each batch of notifications as
	// they arrive, until ctx ends (then it returns nil) or the socket
	// fails. Lost notifications are reported as an Event with Lost set.
	Watch(ctx context.Context, fn func([]Event)) error
	Close() error
}

// monitorRcvBuf is the receive buffer asked for: an `nft flush ruleset`
// of a node with 10k services sends ~100k notifications of ~100 bytes.
// Overflowing it is not a failure (ENOBUFS is reported as Lost).
const monitorRcvBuf = 16 << 20

// Monitor listens to nf_tables notifications of one network namespace.
type Monitor struct {
	sock  *socket.Conn
	netns *os.File
}

var _ Watcher = (*Monitor)(nil)

// NewMonitor opens a netlink socket subscribed to nf_tables
// notifications, in the network namespace that opts name (the caller's
// by default).
func NewMonitor(opts ...NetlinkOption) (*Monitor, error) {
	var n Netlink
	for _, o := range opts {
		if err := o(&n); err != nil {
			_ = n.Close()
			return nil, err
		}
	}
	m := &Monitor{netns: n.netns}
	s, err := socket.Socket(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_NETFILTER, "nftables-monitor", &socket.Config{NetNS: n.netnsFd})
	if err != nil {
		_ = m.Close()
		return nil, fmt.Errorf("nft monitor: opening a NETLINK_NETFILTER socket: %w", err)
	}
	m.sock = s
	if err := s.Bind(&unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1 << (unix.NFNLGRP_NFTABLES - 1)}); err != nil {
		_ = m.Close()
		return nil, fmt.Errorf("nft monitor: joining the nf_tables notification group: %w", err)
	}
	// SO_RCVBUFFORCE needs CAP_NET_ADMIN (which nf_tables needs anyway);
	// without it the default buffer just overflows sooner.
	if err := s.SetsockoptInt(unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, monitorRcvBuf); err != nil {
		_ = s.SetReadBuffer(monitorRcvBuf)
	}
	return m, nil
}

// Close closes the socket and the namespace handle.
func (m *Monitor) Close() error {
	var errs []error
	if m.sock != nil {
		errs = append(errs, m.sock.Close())
		m.sock = nil
	}
	if m.netns != nil {
		errs = append(errs, m.netns.Close())
		m.netns = nil
	}
	return errors.Join(errs...)
}

// Watch implements Watcher.
func (m *Monitor) Watch(ctx context.Context, fn func([]Event)) error {
	// The socket package watches a context for cancellation only when it
	// has no deadline; unblock the receive ourselves either way.
	stop := context.AfterFunc(ctx, func() { _ = m.sock.SetReadDeadline(time.Unix(0, 1)) })
	defer stop()
	rb := make([]byte, 256<<10)
	for {
		n, _, _, _, err := m.sock.Recvmsg(context.Background(), rb, nil, 0)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, unix.ENOBUFS) {
				fn([]Event{{Lost: true, Kind: KindUnknown}})
				continue
			}
			return fmt.Errorf("nft monitor: receiving notifications: %w", err)
		}
		evs, err := DecodeEvents(rb[:n])
		if err != nil {
			return fmt.Errorf("nft monitor: %w", err)
		}
		if len(evs) > 0 {
			fn(evs)
		}
	}
}

// DecodeEvents decodes the nf_tables notifications of one netlink
// datagram. Messages that are not about tables, chains, rules, sets or
// elements (generations, objects, flowtables) are skipped.
func DecodeEvents(b []byte) ([]Event, error) {
	var out []Event
	for len(b) >= nlmsgHdrLen {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		if l < nlmsgHdrLen || l > len(b) {
			return out, fmt.Errorf("malformed netlink message (length %d of %d)", l, len(b))
		}
		typ := binary.NativeEndian.Uint16(b[4:6])
		if typ>>8 == subsysNFT && l >= nlmsgHdrLen+nfgenHdrLen {
			if ev, ok := decodeEvent(typ&0xff, b[nlmsgHdrLen], b[nlmsgHdrLen+nfgenHdrLen:l]); ok {
				ev.PortID = binary.NativeEndian.Uint32(b[12:16])
				out = append(out, ev)
			}
		}
		b = b[min(align4(l), len(b)):]
	}
	return out, nil
}

func familyName(f uint8) Family {
	switch f {
	case unix.NFPROTO_IPV4:
		return IPv4
	case unix.NFPROTO_IPV6:
		return IPv6
	case unix.NFPROTO_INET:
		return "inet"
	case unix.NFPROTO_ARP:
		return "arp"
	case unix.NFPROTO_BRIDGE:
		return "bridge"
	case unix.NFPROTO_NETDEV:
		return "netdev"
	}
	return Family(fmt.Sprintf("family-%d", f))
}

// decodeEvent decodes one notification's attributes. NFT_MSG_DESTROY*
// (Linux 6.3) are requests only: the kernel notifies them as DEL*.
func decodeEvent(msg uint16, family uint8, attrs []byte) (Event, bool) {
	ev := Event{Family: familyName(family), Count: 1}
	var tableAttr, nameAttr uint16
	switch msg {
	case unix.NFT_MSG_NEWTABLE, unix.NFT_MSG_DELTABLE:
		ev.Kind, ev.Deleted = KindTable, msg == unix.NFT_MSG_DELTABLE
		tableAttr = unix.NFTA_TABLE_NAME
	case unix.NFT_MSG_NEWCHAIN, unix.NFT_MSG_DELCHAIN:
		ev.Kind, ev.Deleted = KindChain, msg == unix.NFT_MSG_DELCHAIN
		tableAttr, nameAttr = unix.NFTA_CHAIN_TABLE, unix.NFTA_CHAIN_NAME
	case unix.NFT_MSG_NEWRULE, unix.NFT_MSG_DELRULE:
		ev.Kind, ev.Deleted = KindRule, msg == unix.NFT_MSG_DELRULE
		tableAttr, nameAttr = unix.NFTA_RULE_TABLE, unix.NFTA_RULE_CHAIN
	case unix.NFT_MSG_NEWSET, unix.NFT_MSG_DELSET:
		ev.Kind, ev.Deleted = KindSet, msg == unix.NFT_MSG_DELSET
		tableAttr, nameAttr = unix.NFTA_SET_TABLE, unix.NFTA_SET_NAME
	case unix.NFT_MSG_NEWSETELEM, unix.NFT_MSG_DELSETELEM:
		ev.Kind, ev.Deleted = KindElement, msg == unix.NFT_MSG_DELSETELEM
		tableAttr, nameAttr = unix.NFTA_SET_ELEM_LIST_TABLE, unix.NFTA_SET_ELEM_LIST_SET
	default:
		return Event{}, false
	}
	forEachAttr(attrs, func(typ uint16, data []byte) {
		switch {
		case typ == tableAttr:
			ev.Table = cString(data)
		case typ == nameAttr && nameAttr != 0:
			ev.Name = cString(data)
		case ev.Kind == KindSet && typ == unix.NFTA_SET_FLAGS && len(data) >= 4:
			if binary.BigEndian.Uint32(data)&unix.NFT_SET_MAP != 0 {
				ev.Kind = KindMap
			}
		case ev.Kind == KindElement && typ == unix.NFTA_SET_ELEM_LIST_ELEMENTS:
			n := 0
			forEachAttr(data, func(t uint16, _ []byte) {
				if t == unix.NFTA_LIST_ELEM {
					n++
				}
			})
			ev.Count = max(n, 1)
		}
	})
	return ev, true
}
