package nfnetlink

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/mdlayher/socket"
	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

// This file listens to nf_tables change notifications: what `nft monitor`
// prints. nf_tables sends one message per changed object to the netlink
// multicast group NFNLGRP_NFTABLES when a transaction commits, each with
// the netlink port id of the socket that sent the transaction in its
// header (nlmsg_pid; ctx->portid in nf_tables_api.c). kproxy tells its own
// changes from others' by that port id (see Netlink.OwnPort).

// monitorRcvBuf is the receive buffer asked for. The kernel sends a
// transaction's notifications at its commit, in one burst: an `nft flush
// ruleset` of a node with 10k services ~100k of ~100 bytes, kproxy's own
// full sync of 10k services in a realistic mix (108k endpoints) more than
// 16 MiB. A buffer that overflows loses notifications; taken for drift,
// the loss would be repaired by a full sync that could overflow again.
// The memory is the kernel's, held only while the reader is behind. Overflowing it is not a
// failure (ENOBUFS is reported as Lost).
const monitorRcvBuf = 64 << 20

// Monitor listens to nf_tables notifications of one network namespace.
type Monitor struct {
	sock  *socket.Conn
	netns *os.File
	skip  func(portID uint32) bool
}

// SkipPorts makes Watch drop, without decoding them, the notifications
// whose sender's port id skip reports (kproxy's own transactions, which
// the reader must keep up with). Call it before Watch.
func (m *Monitor) SkipPorts(skip func(portID uint32) bool) { m.skip = skip }

var _ nft.Watcher = (*Monitor)(nil)

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
func (m *Monitor) Watch(ctx context.Context, fn func([]nft.Event)) error {
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
				fn([]nft.Event{{Lost: true, Kind: nft.KindUnknown}})
				continue
			}
			return fmt.Errorf("nft monitor: receiving notifications: %w", err)
		}
		evs, err := decodeEvents(rb[:n], m.skip)
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
func DecodeEvents(b []byte) ([]nft.Event, error) { return decodeEvents(b, nil) }

// decodeEvents is DecodeEvents without the messages whose port id skip
// (when not nil) reports.
func decodeEvents(b []byte, skip func(uint32) bool) ([]nft.Event, error) {
	var out []nft.Event
	for len(b) >= nlmsgHdrLen {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		if l < nlmsgHdrLen || l > len(b) {
			return out, fmt.Errorf("malformed netlink message (length %d of %d)", l, len(b))
		}
		typ := binary.NativeEndian.Uint16(b[4:6])
		port := binary.NativeEndian.Uint32(b[12:16])
		if typ>>8 == subsysNFT && l >= nlmsgHdrLen+nfgenHdrLen && (skip == nil || !skip(port)) {
			if ev, ok := decodeEvent(typ&0xff, b[nlmsgHdrLen], b[nlmsgHdrLen+nfgenHdrLen:l]); ok {
				ev.PortID = port
				out = append(out, ev)
			}
		}
		b = b[min(align4(l), len(b)):]
	}
	return out, nil
}

func familyName(f uint8) nft.Family {
	switch f {
	case unix.NFPROTO_IPV4:
		return nft.IPv4
	case unix.NFPROTO_IPV6:
		return nft.IPv6
	case unix.NFPROTO_INET:
		return "inet"
	case unix.NFPROTO_ARP:
		return "arp"
	case unix.NFPROTO_BRIDGE:
		return "bridge"
	case unix.NFPROTO_NETDEV:
		return "netdev"
	}
	return nft.Family(fmt.Sprintf("family-%d", f))
}

// decodeEvent decodes one notification's attributes. NFT_MSG_DESTROY*
// (Linux 6.3) are requests only: the kernel notifies them as DEL*.
func decodeEvent(msg uint16, family uint8, attrs []byte) (nft.Event, bool) {
	ev := nft.Event{Family: familyName(family), Count: 1}
	var tableAttr, nameAttr uint16
	switch msg {
	case unix.NFT_MSG_NEWTABLE, unix.NFT_MSG_DELTABLE:
		ev.Kind, ev.Deleted = nft.KindTable, msg == unix.NFT_MSG_DELTABLE
		tableAttr = unix.NFTA_TABLE_NAME
	case unix.NFT_MSG_NEWCHAIN, unix.NFT_MSG_DELCHAIN:
		ev.Kind, ev.Deleted = nft.KindChain, msg == unix.NFT_MSG_DELCHAIN
		tableAttr, nameAttr = unix.NFTA_CHAIN_TABLE, unix.NFTA_CHAIN_NAME
	case unix.NFT_MSG_NEWRULE, unix.NFT_MSG_DELRULE:
		ev.Kind, ev.Deleted = nft.KindRule, msg == unix.NFT_MSG_DELRULE
		tableAttr, nameAttr = unix.NFTA_RULE_TABLE, unix.NFTA_RULE_CHAIN
	case unix.NFT_MSG_NEWSET, unix.NFT_MSG_DELSET:
		ev.Kind, ev.Deleted = nft.KindSet, msg == unix.NFT_MSG_DELSET
		tableAttr, nameAttr = unix.NFTA_SET_TABLE, unix.NFTA_SET_NAME
	case unix.NFT_MSG_NEWSETELEM, unix.NFT_MSG_DELSETELEM:
		ev.Kind, ev.Deleted = nft.KindElement, msg == unix.NFT_MSG_DELSETELEM
		tableAttr, nameAttr = unix.NFTA_SET_ELEM_LIST_TABLE, unix.NFTA_SET_ELEM_LIST_SET
	default:
		return nft.Event{}, false
	}
	forEachAttr(attrs, func(typ uint16, data []byte) {
		switch {
		case typ == tableAttr:
			ev.Table = cString(data)
		case typ == nameAttr && nameAttr != 0:
			ev.Name = cString(data)
		case ev.Kind == nft.KindSet && typ == unix.NFTA_SET_FLAGS && len(data) >= 4:
			if binary.BigEndian.Uint32(data)&unix.NFT_SET_MAP != 0 {
				ev.Kind = nft.KindMap
			}
		case ev.Kind == nft.KindElement && typ == unix.NFTA_SET_ELEM_LIST_ELEMENTS:
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
