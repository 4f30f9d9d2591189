package nfnetlink

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/mdlayher/socket"
	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

// This file is the netlink transport: one NETLINK_NETFILTER socket, raw
// message framing, a batch send that maps kernel errors back to the
// message that caused them, and dumps for the few listings we need.
//
// We frame messages ourselves (rather than through nftables.Conn.Flush)
// because we need three things that library hides: the sequence number
// of a rejected message (to say which operation failed), the kernel's
// extended ack offset (to say which element or statement), and control of
// the header flags (no NLM_F_ACK/NLM_F_ECHO per message, which would
// flood the receive buffer with one reply per rule on large syncs).

const (
	nlmsgHdrLen  = 16        // struct nlmsghdr
	nfgenHdrLen  = 4         // struct nfgenmsg
	nlaHdrLen    = 4         // struct nlattr
	nlmsgErrLen  = 4         // the errno of struct nlmsgerr, followed by the request's header
	maxAttrBytes = 60000     // keep an element list below the 64 KiB nla_len limit
	rcvBufBytes  = 4 << 20   // room for error replies; see sendBatch
	defaultDump  = 256 << 10 // recv buffer for dumps (the kernel caps a dump skb at 32 KiB)
	// getReplyBytes is the recv buffer of a get: the kernel builds a
	// get's reply in NLMSG_GOODSIZE (at most 8 KiB), then the ack.
	getReplyBytes = 64 << 10
	subsysNFT     = unix.NFNL_SUBSYS_NFTABLES
)

// nlMsg is one nf_tables message of a batch, with what we need to explain
// an error about it.
type nlMsg struct {
	typ    uint16 // NFT_MSG_*
	flags  uint16 // in addition to NLM_F_REQUEST
	family uint8
	attrs  []byte
	// wire, when set, is the whole message as sent, attrs inside it,
	// with room for the headers that sendBatch fills in (see
	// lowerer.frame).
	wire []byte

	op int // index of the transaction op this message belongs to

	// For element lists: op index of each element and the byte range of
	// its attribute within attrs, to map an extack offset to the element.
	elemOps    []int
	elemStarts []int
	// For rules: the statement each expression came from, and the byte
	// offset of each expression attribute within attrs.
	exprStmts  []int
	exprStarts []int
}

// nlConn is a NETLINK_NETFILTER socket, possibly in another network namespace.
type nlConn struct {
	sock *socket.Conn
	pid  uint32
	seq  uint32
	// getBuf is get's receive buffer, allocated at the first get and
	// reused: lowering may ask for hundreds of set definitions in one
	// sync, and a fresh 256 KiB buffer each was most of their cost.
	getBuf []byte
}

// dialNetfilter opens a netfilter netlink socket. netnsFd 0 means the
// caller's network namespace.
func dialNetfilter(netnsFd int) (*nlConn, error) {
	s, err := socket.Socket(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_NETFILTER, "nftables", &socket.Config{NetNS: netnsFd})
	if err != nil {
		if errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.EAFNOSUPPORT) {
			return nil, fmt.Errorf("%w: opening a NETLINK_NETFILTER socket: %w", nft.ErrNotSupported, err)
		}
		return nil, fmt.Errorf("opening a NETLINK_NETFILTER socket: %w", err)
	}
	if err := s.Bind(&unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("binding the netlink socket: %w", err)
	}
	sa, err := s.Getsockname()
	if err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("netlink getsockname: %w", err)
	}
	nl, ok := sa.(*unix.SockaddrNetlink)
	if !ok {
		_ = s.Close()
		return nil, fmt.Errorf("netlink getsockname: unexpected address %T", sa)
	}
	// Extended acks carry the offset of the offending attribute (we map it
	// to an element or a statement); capped acks do not echo the request
	// back, which for a large element list would not fit the buffer.
	// Both exist since Linux 4.12; without them errors are just less precise.
	_ = s.SetsockoptInt(unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1)
	_ = s.SetsockoptInt(unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
	return &nlConn{sock: s, pid: nl.Pid, seq: 1}, nil
}

func (c *nlConn) Close() error { return c.sock.Close() }

func (c *nlConn) nextSeq() uint32 {
	c.seq++
	return c.seq
}

// frameBatch numbers msgs from the next sequence number on and returns
// the batch to send: begin, the messages, and end unless check. Messages
// a lowerer framed are not copied: each run of them framed one after the
// other is one buffer; others are copied into one.
func (c *nlConn) frameBatch(msgs []nlMsg, check bool) (bufs [][]byte, size int) {
	begin := appendMsg(nil, unix.NFNL_MSG_BATCH_BEGIN, unix.NLM_F_REQUEST, c.nextSeq(), unix.AF_UNSPEC, subsysNFT, nil)
	first := c.seq
	bufs, size = [][]byte{begin}, len(begin)
	framed := true
	for i := range msgs {
		m := &msgs[i]
		if m.wire == nil {
			framed = false
			break
		}
		putHeader(m.wire, nftType(m.typ), unix.NLM_F_REQUEST|m.flags, c.nextSeq(), m.family, 0, len(m.attrs))
		size += len(m.wire)
		// A message framed right after the previous one extends that
		// buffer.
		if last := len(bufs) - 1; last > 0 && adjacent(bufs[last], m.wire) {
			bufs[last] = bufs[last][:len(bufs[last])+len(m.wire)]
		} else {
			bufs = append(bufs, m.wire)
		}
	}
	if !framed || len(bufs)+1 > maxIovecs {
		// Messages not framed by a lowerer, or a batch in more blocks
		// than one sendmsg takes: copied into one buffer.
		c.seq = first
		buf := make([]byte, 0, batchBytes(msgs))
		buf = append(buf, begin...)
		for i := range msgs {
			m := &msgs[i]
			buf = appendMsg(buf, nftType(m.typ), unix.NLM_F_REQUEST|m.flags, c.nextSeq(), m.family, 0, m.attrs)
		}
		bufs, size = [][]byte{buf}, len(buf)
	}
	end := appendMsg(nil, unix.NFNL_MSG_BATCH_END, unix.NLM_F_REQUEST, c.nextSeq(), unix.AF_UNSPEC, subsysNFT, nil)
	if !check {
		bufs = append(bufs, end)
		size += len(end)
	}
	return bufs, size
}

// maxIovecs is how many buffers one sendmsg takes (the kernel's
// UIO_MAXIOV).
const maxIovecs = 1024

// adjacent reports whether b starts where a ends in memory (a's capacity
// reaches into b): two messages framed one after the other in a block.
func adjacent(a, b []byte) bool {
	return cap(a) > len(a) && len(b) > 0 && &a[:len(a)+1][len(a)] == &b[0]
}

// batchBytes is the size of the batch's begin and msgs framed (its end
// is not counted).
func batchBytes(msgs []nlMsg) int {
	n := nlmsgHdrLen + nfgenHdrLen
	for i := range msgs {
		n += nlmsgHdrLen + nfgenHdrLen + align4(len(msgs[i].attrs))
	}
	return n
}

// sendmsgBuffers sends bufs as one datagram to the kernel (one skb: what
// a batch needs), without gathering them into one buffer first.
func (c *nlConn) sendmsgBuffers(bufs [][]byte) error {
	rc, err := c.sock.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Write(func(fd uintptr) bool {
		_, serr = unix.SendmsgBuffers(int(fd), bufs, nil, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}, 0)
		// Not done on EAGAIN: wait until the socket can take it.
		return !errors.Is(serr, unix.EAGAIN)
	}); err != nil {
		return err
	}
	return serr
}

// putHeader writes a message's nlmsghdr and nfgenmsg into w's first bytes,
// for attrsLen bytes of attributes after them.
func putHeader(w []byte, typ uint16, flags uint16, seq uint32, family uint8, resID uint16, attrsLen int) {
	binary.NativeEndian.PutUint32(w[0:4], uint32(nlmsgHdrLen+nfgenHdrLen+attrsLen))
	binary.NativeEndian.PutUint16(w[4:6], typ)
	binary.NativeEndian.PutUint16(w[6:8], flags)
	binary.NativeEndian.PutUint32(w[8:12], seq)
	binary.NativeEndian.PutUint32(w[12:16], 0)
	w[16] = family
	w[17] = unix.NFNETLINK_V0
	binary.BigEndian.PutUint16(w[18:20], resID)
}

// appendMsg frames one message: nlmsghdr, nfgenmsg, attributes.
func appendMsg(b []byte, typ uint16, flags uint16, seq uint32, family uint8, resID uint16, attrs []byte) []byte {
	var h [nlmsgHdrLen + nfgenHdrLen]byte
	putHeader(h[:], typ, flags, seq, family, resID, len(attrs))
	b = append(b, h[:]...)
	b = append(b, attrs...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func nftType(msg uint16) uint16 { return subsysNFT<<8 | msg }

// batchError is one error the kernel reported for a batch.
type batchError struct {
	msg    int // index into the batch's messages; -1 for the batch itself
	errno  unix.Errno
	text   string // extack message, if any
	offset int    // extack offset into the message payload after nfgenmsg; -1 if none
}

// sendBatch sends msgs as one nf_tables transaction and returns the errors
// the kernel reported (none means it was committed). With check, the
// batch is sent without its end message: the kernel runs every message
// and validates the result, reports what fails, and aborts (what `nft -c`
// does; nfnetlink's NFNL_ABORT_VALIDATE). Nothing changes, and nothing is
// notified.
//
// Messages carry no NLM_F_ACK: nfnetlink reports every failing message
// anyway, and since the kernel processes (and commits or aborts) the
// whole batch synchronously inside sendmsg, everything it has to say is
// queued on our socket when sendmsg returns. A GETGEN request sent after
// the batch marks the end of those replies. This is how nft(8) avoids
// one ack per message too.
func (c *nlConn) sendBatch(ctx context.Context, msgs []nlMsg, check bool) ([]batchError, error) {
	seqBase := c.seq + 1
	bufs, size := c.frameBatch(msgs, check)
	endSeq := c.seq

	// The whole batch must go in one sendmsg (nfnetlink only sees a batch
	// inside one skb), and netlink refuses a message larger than the send
	// buffer with EMSGSIZE. SO_SNDBUFFORCE needs CAP_NET_ADMIN, which we
	// need for nf_tables anyway.
	if err := c.sock.SetWriteBuffer(size + 4096); err != nil {
		return nil, fmt.Errorf("setting the netlink send buffer to %d bytes: %w", size, err)
	}
	_ = c.sock.SetReadBuffer(rcvBufBytes)

	if err := c.sendmsgBuffers(bufs); err != nil {
		if errors.Is(err, unix.EMSGSIZE) {
			return nil, fmt.Errorf("sending a %d byte batch: %w (the send buffer could not be raised; is CAP_NET_ADMIN missing?)", size, err)
		}
		return nil, fmt.Errorf("sending the batch: %w", err)
	}

	// Marker: GETGEN is answered only after the batch has been handled.
	genSeq := c.nextSeq()
	marker := appendMsg(nil, nftType(unix.NFT_MSG_GETGEN), unix.NLM_F_REQUEST, genSeq, unix.AF_UNSPEC, 0, nil)
	if _, err := c.sock.Sendmsg(ctx, marker, nil, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}, 0); err != nil {
		return nil, fmt.Errorf("sending the end-of-batch marker: %w", err)
	}

	var errs []batchError
	rb := make([]byte, 64<<10)
	for {
		n, _, _, _, err := c.sock.Recvmsg(ctx, rb, nil, 0)
		if err != nil {
			if errors.Is(err, unix.ENOBUFS) {
				// Replies were dropped; only error replies are ever sent
				// for a batch, so it failed.
				errs = append(errs, batchError{msg: -1, errno: unix.ENOBUFS, offset: -1,
					text: "more errors than the receive buffer holds"})
				continue
			}
			return errs, fmt.Errorf("receiving the batch result: %w", err)
		}
		done := false
		if err := forEachMsg(rb[:n], func(typ uint16, flags uint16, seq uint32, payload []byte) error {
			switch {
			case seq == genSeq:
				done = true
				if typ == unix.NLMSG_ERROR {
					if e := parseNlErr(flags, payload); e.errno != 0 && len(errs) == 0 {
						// Without nf_tables, GETGEN fails too.
						errs = append(errs, batchError{msg: -1, errno: e.errno, text: e.text, offset: -1})
					}
				}
			case typ == unix.NLMSG_ERROR:
				e := parseNlErr(flags, payload)
				if e.errno == 0 {
					return nil
				}
				e.msg = -1
				if seq > seqBase && seq < endSeq {
					e.msg = int(seq - seqBase - 1)
				}
				errs = append(errs, e)
			}
			return nil
		}); err != nil {
			return errs, err
		}
		if done {
			return errs, nil
		}
	}
}

func align4(n int) int { return (n + 3) &^ 3 }

// forEachMsg walks the netlink messages in one datagram.
func forEachMsg(b []byte, fn func(typ, flags uint16, seq uint32, payload []byte) error) error {
	for len(b) >= nlmsgHdrLen {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		if l < nlmsgHdrLen || l > len(b) {
			return fmt.Errorf("malformed netlink message (length %d of %d)", l, len(b))
		}
		typ := binary.NativeEndian.Uint16(b[4:6])
		flags := binary.NativeEndian.Uint16(b[6:8])
		seq := binary.NativeEndian.Uint32(b[8:12])
		if err := fn(typ, flags, seq, b[nlmsgHdrLen:l]); err != nil {
			return err
		}
		b = b[min(align4(l), len(b)):]
	}
	return nil
}

// parseNlErr decodes struct nlmsgerr plus extended ack TLVs.
func parseNlErr(flags uint16, p []byte) batchError {
	e := batchError{offset: -1}
	if len(p) < nlmsgErrLen {
		e.errno = unix.EPROTO
		return e
	}
	code := int32(binary.NativeEndian.Uint32(p[0:4]))
	if code < 0 {
		e.errno = unix.Errno(-code)
	} else {
		e.errno = unix.Errno(code)
	}
	if flags&unix.NLM_F_ACK_TLVS == 0 || len(p) < nlmsgErrLen+nlmsgHdrLen {
		return e
	}
	// The original header follows; with NETLINK_CAP_ACK (flag
	// NLM_F_CAPPED) only the header, otherwise the whole request.
	origLen := int(binary.NativeEndian.Uint32(p[4:8]))
	tlvStart := nlmsgErrLen + nlmsgHdrLen
	if flags&unix.NLM_F_CAPPED == 0 {
		tlvStart = nlmsgErrLen + align4(origLen)
	}
	if tlvStart > len(p) {
		return e
	}
	forEachAttr(p[tlvStart:], func(typ uint16, data []byte) {
		switch typ {
		case unix.NLMSGERR_ATTR_MSG:
			e.text = cString(data)
		case unix.NLMSGERR_ATTR_OFFS:
			if len(data) >= 4 {
				// Offset from the start of the original nlmsghdr; we keep
				// it relative to our attribute bytes.
				e.offset = int(binary.NativeEndian.Uint32(data)) - nlmsgHdrLen - nfgenHdrLen
			}
		}
	})
	return e
}

func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// forEachAttr walks a flat list of netlink attributes.
func forEachAttr(b []byte, fn func(typ uint16, data []byte)) {
	for len(b) >= nlaHdrLen {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < nlaHdrLen || l > len(b) {
			return
		}
		fn(binary.NativeEndian.Uint16(b[2:4])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER), b[nlaHdrLen:l])
		b = b[min(align4(l), len(b)):]
	}
}

// dump runs a GET request with NLM_F_DUMP and returns each reply's
// attribute bytes (after nfgenmsg).
func (c *nlConn) dump(ctx context.Context, msg uint16, family uint8, attrs []byte) ([][]byte, error) {
	var out [][]byte
	err := c.dumpEach(ctx, msg, family, attrs, func(b []byte) bool {
		out = append(out, append([]byte(nil), b...))
		return true
	})
	return out, err
}

// dumpEach runs a dump and calls fn with each reply's attribute bytes
// until fn returns false (the socket must then be closed, as the rest
// of the dump is still queued) or the dump ends.
func (c *nlConn) dumpEach(ctx context.Context, msg uint16, family uint8, attrs []byte, fn func([]byte) bool) error {
	return c.dumpFamilies(ctx, msg, family, attrs, func(_ uint8, b []byte) bool { return fn(b) })
}

// dumpFamilies runs a dump of one family (NFPROTO_UNSPEC: every family) and calls
// fn with each reply's family and attribute bytes until fn returns false
// or the dump ends.
func (c *nlConn) dumpFamilies(ctx context.Context, msg uint16, family uint8, attrs []byte, fn func(family uint8, attrs []byte) bool) error {
	seq := c.nextSeq()
	req := appendMsg(nil, nftType(msg), unix.NLM_F_REQUEST|unix.NLM_F_DUMP, seq, family, 0, attrs)
	if _, err := c.sock.Sendmsg(ctx, req, nil, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}, 0); err != nil {
		return err
	}
	rb := make([]byte, defaultDump)
	for {
		n, _, _, _, err := c.sock.Recvmsg(ctx, rb, nil, 0)
		if err != nil {
			return err
		}
		done := false
		var derr error
		if err := forEachMsg(rb[:n], func(typ, flags uint16, s uint32, payload []byte) error {
			if s != seq || done {
				return nil
			}
			switch typ {
			case unix.NLMSG_DONE:
				done = true
			case unix.NLMSG_ERROR:
				if e := parseNlErr(flags, payload); e.errno != 0 {
					derr = e.errno
				}
				done = true
			default:
				if len(payload) >= nfgenHdrLen && !fn(payload[0], payload[nfgenHdrLen:]) {
					done = true
				}
			}
			return nil
		}); err != nil {
			return err
		}
		if derr != nil {
			return derr
		}
		if done {
			return nil
		}
	}
}

// get runs a plain GET request (no dump) and returns the reply's
// attribute bytes.
func (c *nlConn) get(ctx context.Context, msg uint16, family uint8, attrs []byte) ([]byte, error) {
	seq := c.nextSeq()
	req := appendMsg(nil, nftType(msg), unix.NLM_F_REQUEST|unix.NLM_F_ACK, seq, family, 0, attrs)
	if _, err := c.sock.Sendmsg(ctx, req, nil, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}, 0); err != nil {
		return nil, err
	}
	if c.getBuf == nil {
		c.getBuf = make([]byte, getReplyBytes)
	}
	rb := c.getBuf
	var out []byte
	for {
		n, _, _, _, err := c.sock.Recvmsg(ctx, rb, nil, 0)
		if err != nil {
			return nil, err
		}
		done := false
		var gerr error
		if err := forEachMsg(rb[:n], func(typ, flags uint16, s uint32, payload []byte) error {
			if s != seq {
				return nil
			}
			if typ == unix.NLMSG_ERROR {
				if e := parseNlErr(flags, payload); e.errno != 0 {
					gerr = e.errno
				}
				done = true // the ack comes after the reply
				return nil
			}
			if len(payload) >= nfgenHdrLen {
				out = append([]byte(nil), payload[nfgenHdrLen:]...)
			}
			return nil
		}); err != nil {
			return nil, err
		}
		if gerr != nil {
			return nil, gerr
		}
		if done {
			return out, nil
		}
	}
}
