// Package nfnetlink sends nft transactions to the kernel over nf_tables
// netlink, each as one batch (the kernel commits all of it or none),
// lists what the kernel holds, and listens to its change notifications
// (the drift monitor). lower.go turns a transaction into messages,
// exprenc.go and nlattr.go encode expressions and attributes, nlsock.go is
// the socket. It is checked against `nft -f` (nft.Exec) in the kernel
// tests.
package nfnetlink

import (
	v1 "k8s.io/api/core/v1"

	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

// Netlink applies transactions through nf_tables netlink, each one as a
// single batch: the kernel commits all of it or none of it.
type Netlink struct {
	netnsFd int
	netns   *os.File // opened by WithNetNSPath; closed by Close

	// apply is the socket every transaction is sent on, kept open so
	// that its port id, which the kernel puts in the header of each
	// change notification the transaction causes, stays ours and stays
	// the same: that is how kproxy's drift monitor tells its own changes
	// from others'. Port ids are unique per network namespace while the
	// socket is bound. It is replaced only after a transport failure
	// (its receive queue may then hold stale replies).
	mu    sync.Mutex
	apply *nlConn
	// query answers lowering's questions about existing sets (their
	// definitions), kept open under mu like apply: a burst's partial
	// sync asks for hundreds, and opening a socket in the namespace for
	// each was half of the sync's CPU; closing one after each
	// transaction cost 10-15 ms of its latency.
	query *nlConn
	// ports are the port ids of every apply socket this adapter has
	// used (a handful at most), since notifications of a transaction on
	// a replaced socket may still be queued at the monitor. Guarded by
	// portsMu, not mu: the monitor asks while a transaction is sent.
	portsMu sync.Mutex
	ports   []uint32
	// dials counts the sockets opened (a test's way to see that a
	// transaction's questions share one).
	dials atomic.Int64
	// gens, when set, counts the batches committed (WithGenerations).
	gens *Generations
}

var _ nft.Interface = (*Netlink)(nil)

// NetlinkOption configures NewNetlink.
type NetlinkOption func(*Netlink) error

// WithNetNSFd programs the network namespace the fd refers to instead of
// the caller's. The caller keeps ownership of the fd.
func WithNetNSFd(fd int) NetlinkOption {
	return func(n *Netlink) error {
		n.netnsFd = fd
		return nil
	}
}

// WithNetNSPath programs the network namespace at path (for example
// /run/netns/NAME or /proc/PID/ns/net). Close releases it.
func WithNetNSPath(path string) NetlinkOption {
	return func(n *Netlink) error {
		f, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("opening network namespace %s: %w", path, err)
		}
		n.netns = f
		n.netnsFd = int(f.Fd())
		return nil
	}
}

// NewNetlink returns a netlink adapter after checking that the kernel
// speaks nf_tables (an error matching ErrNotSupported if not).
func NewNetlink(opts ...NetlinkOption) (*Netlink, error) {
	n := &Netlink{}
	for _, o := range opts {
		if err := o(n); err != nil {
			_ = n.Close()
			return nil, err
		}
	}
	c, err := dialNetfilter(n.netnsFd)
	if err != nil {
		_ = n.Close()
		return nil, fmt.Errorf("nft: %w", err)
	}
	defer c.Close()
	// GETGEN is the cheapest request nf_tables answers; without nf_tables
	// nfnetlink answers EOPNOTSUPP (or the request is unknown: ENOENT).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.get(ctx, unix.NFT_MSG_GETGEN, unix.AF_UNSPEC, nil); err != nil {
		_ = n.Close()
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EPROTONOSUPPORT) {
			return nil, fmt.Errorf("nft: %w in this kernel (netlink: %w)", nft.ErrNotSupported, err)
		}
		return nil, fmt.Errorf("nft: querying the nf_tables generation: %w", err)
	}
	return n, nil
}

// Close releases the apply socket and the network namespace opened by
// WithNetNSPath.
func (n *Netlink) Close() error {
	n.mu.Lock()
	if n.apply != nil {
		_ = n.apply.Close()
		n.apply = nil
	}
	n.dropQuery()
	n.mu.Unlock()
	if n.netns != nil {
		err := n.netns.Close()
		n.netns = nil
		return err
	}
	return nil
}

func (n *Netlink) dial() (*nlConn, error) {
	n.dials.Add(1)
	c, err := dialNetfilter(n.netnsFd)
	if err != nil {
		return nil, fmt.Errorf("nft: %w", err)
	}
	return c, nil
}

// Apply sends the transaction as one batch.
func (n *Netlink) Apply(ctx context.Context, tx *nft.Transaction) error {
	return n.send(ctx, tx, false)
}

// Check implements Checker: the kernel runs and validates the batch, then
// aborts it.
func (n *Netlink) Check(ctx context.Context, tx *nft.Transaction) error {
	return n.send(ctx, tx, true)
}

func (n *Netlink) send(ctx context.Context, tx *nft.Transaction, check bool) error {
	if tx.Len() == 0 {
		return nil
	}
	start := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	c, err := n.applyConn()
	if err != nil {
		return nft.WrapApplyError(tx, err)
	}

	l := newLowerer(tx, &nlView{n: n, ctx: ctx, tx: tx})
	if err := l.lower(); err != nil {
		return nft.WrapApplyError(tx, err)
	}
	lowered := time.Now()
	count := n.gens != nil && !check
	if count {
		if err := n.gens.begin(ctx, c); err != nil {
			return nft.WrapApplyError(tx, err)
		}
	}
	errs, err := c.sendBatch(ctx, l.msgs, check)
	if count {
		n.gens.end(err == nil && len(errs) == 0, err != nil)
	}
	if err != nil {
		// Replies of this batch may still arrive; the next batch must
		// not read them as its own.
		_ = c.Close()
		n.apply = nil
	}
	if err == nil && len(errs) > 0 {
		err = l.explain(errs)
	}
	if err != nil {
		return nft.WrapApplyError(tx, err)
	}
	if klogV := klog.V(4); klogV.Enabled() && !check {
		// What was handed to the kernel, and how long lowering (Go) and
		// the kernel's commit took: test/bench/cmd/kproxy-bench reads these.
		bytes := 0
		for i := range l.msgs {
			bytes += nlmsgHdrLen + nfgenHdrLen + align4(len(l.msgs[i].attrs))
		}
		klogV.InfoS("Applied nftables transaction", "family", tx.Family, "tables", tx.Tables(),
			"operations", tx.Len(), "messages", len(l.msgs), "bytes", bytes, "elapsed", time.Since(start),
			"lowerSeconds", lowered.Sub(start).Seconds(), "kernelSeconds", time.Since(lowered).Seconds())
	}
	return nil
}

// applyConn returns the apply socket, opening it if needed. n.mu is held.
func (n *Netlink) applyConn() (*nlConn, error) {
	if n.apply != nil {
		return n.apply, nil
	}
	c, err := n.dial()
	if err != nil {
		return nil, err
	}
	n.apply = c
	n.portsMu.Lock()
	defer n.portsMu.Unlock()
	if !slices.Contains(n.ports, c.pid) {
		if len(n.ports) == maxOwnPorts {
			n.ports = n.ports[1:]
		}
		n.ports = append(n.ports, c.pid)
	}
	return c, nil
}

// maxOwnPorts bounds the port ids remembered: a replaced socket's late
// notifications are read within milliseconds, and an old id may be
// reused by another process's socket after ours closed.
const maxOwnPorts = 4

// OwnPort reports whether a change notification's port id is that of a
// socket this adapter sent a transaction on: the change is kproxy's own.
// Changes made through other sockets (nft, iptables-nft, another
// program, or this adapter's DeleteTable) are not.
func (n *Netlink) OwnPort(portID uint32) bool {
	n.portsMu.Lock()
	defer n.portsMu.Unlock()
	return portID != 0 && slices.Contains(n.ports, portID)
}

// explain turns the kernel's errors into OpErrors naming the operation,
// and the element or statement when the kernel pointed at one.
func (l *lowerer) explain(errs []batchError) error {
	slices.SortStableFunc(errs, func(a, b batchError) int { return a.msg - b.msg })
	const maxReported = 10
	var out []error
	for _, e := range errs {
		if len(out) == maxReported {
			out = append(out, fmt.Errorf("%d more errors", len(errs)-maxReported))
			break
		}
		oe := &nft.OpError{Index: -1, Message: e.text, Err: e.errno}
		if e.msg < 0 || e.msg >= len(l.msgs) {
			if e.errno == unix.EOPNOTSUPP {
				// nfnetlink without the nf_tables subsystem.
				oe.Err = fmt.Errorf("%w in this kernel: %w", nft.ErrNotSupported, e.errno)
			}
			out = append(out, oe)
			continue
		}
		m := &l.msgs[e.msg]
		oe.Index = m.op
		if e.offset >= 0 {
			if k := lastLE(m.elemStarts, e.offset); k >= 0 {
				oe.Index = m.elemOps[k]
			}
			if k := lastLE(m.exprStarts, e.offset); k >= 0 {
				if r := l.tx.Ops[m.op].Rule; r != nil && m.exprStmts[k] < len(r.Stmts) {
					oe.Detail = "statement " + nft.StmtText(l.tx.Family, r.Stmts[m.exprStmts[k]])
				}
			}
		}
		if oe.Index >= 0 {
			oe.Op = l.tx.OpText(oe.Index)
		}
		out = append(out, oe)
	}
	if len(out) == 1 {
		return out[0]
	}
	return errors.Join(out...)
}

// lastLE returns the index of the last start <= off, or -1.
func lastLE(starts []int, off int) int {
	k := -1
	for i, s := range starts {
		if s <= off {
			k = i
		}
	}
	return k
}

// queryConn returns the query socket, opening it if needed. n.mu is held.
func (n *Netlink) queryConn() (*nlConn, error) {
	if n.query == nil {
		c, err := n.dial()
		if err != nil {
			return nil, err
		}
		n.query = c
	}
	return n.query, nil
}

// dropQuery closes the query socket, if open. n.mu is held.
func (n *Netlink) dropQuery() {
	if n.query != nil {
		_ = n.query.Close()
		n.query = nil
	}
}

// nlView answers the lowerer's questions about existing sets; it lives
// inside send, which holds n.mu.
type nlView struct {
	n   *Netlink
	ctx context.Context
	tx  *nft.Transaction
}

func (v *nlView) setDef(table, name string) (*nft.Set, error) {
	c, err := v.n.queryConn()
	if err != nil {
		return nil, err
	}
	var a attrs
	a.str(unix.NFTA_SET_TABLE, table)
	a.str(unix.NFTA_SET_NAME, name)
	b, err := c.get(v.ctx, unix.NFT_MSG_GETSET, nfproto(v.tx.Family), a.b)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		// Replies may still be queued: the next question opens a
		// fresh socket.
		v.n.dropQuery()
		return nil, fmt.Errorf("reading set %s: %w", name, err)
	}
	return decodeSet(b)
}

func (v *nlView) setEmpty(table, name string) (bool, error) {
	c, err := v.n.dial()
	if err != nil {
		return false, err
	}
	// Closing the socket abandons the rest of the dump: one reply is
	// enough to know whether the set has elements.
	defer c.Close()
	var a attrs
	a.str(unix.NFTA_SET_ELEM_LIST_TABLE, table)
	a.str(unix.NFTA_SET_ELEM_LIST_SET, name)
	empty := true
	err = c.dumpEach(v.ctx, unix.NFT_MSG_GETSETELEM, nfproto(v.tx.Family), a.b, func(b []byte) bool {
		forEachAttr(b, func(typ uint16, data []byte) {
			if typ == unix.NFTA_SET_ELEM_LIST_ELEMENTS && len(data) > 0 {
				empty = false
			}
		})
		return empty
	})
	if errors.Is(err, unix.ENOENT) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading elements of set %s: %w", name, err)
	}
	return empty, nil
}

// decodeSet reads the parts of a set definition lowering needs.
func decodeSet(b []byte) (*nft.Set, error) {
	s := &nft.Set{}
	var flags, ktype, dtype uint32
	var udata []byte
	forEachAttr(b, func(typ uint16, data []byte) {
		switch typ {
		case unix.NFTA_SET_USERDATA:
			udata = data
		case unix.NFTA_SET_NAME:
			s.Name = cString(data)
		case unix.NFTA_SET_FLAGS:
			flags = binary.BigEndian.Uint32(data)
		case unix.NFTA_SET_KEY_TYPE:
			ktype = binary.BigEndian.Uint32(data)
		case unix.NFTA_SET_DATA_TYPE:
			dtype = binary.BigEndian.Uint32(data)
		case unix.NFTA_SET_TIMEOUT:
			s.Timeout = time.Duration(binary.BigEndian.Uint64(data)) * time.Millisecond
		}
	})
	addrPort := dtype == dtIPv4Addr<<dtBitsConcat|dtInetService || dtype == dtIPv6Addr<<dtBitsConcat|dtInetService
	if flags&setMap != 0 && addrPort && ktype == dtInteger {
		// An endpoint map: its protocol is in the typeof user data.
		for _, p := range []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP} {
			n, _ := ProtoNumber(p)
			if len(udata) > 84 && udata[84] == endpointProtoDesc[n] {
				s.Endpoints = p
				return s, nil
			}
		}
		return nil, fmt.Errorf("set %s is a map from integers whose type kproxy does not know", s.Name)
	}
	if flags&setMap != 0 && addrPort && ktype == dtype<<dtBitsConcat|dtInteger {
		// An endpoint map keyed by service: the user data is what
		// kproxy writes for one of the protocols.
		for _, p := range []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP} {
			n, _ := ProtoNumber(p)
			fam := uint8(unix.NFPROTO_IPV4)
			if dtype>>dtBitsConcat == dtIPv6Addr {
				fam = unix.NFPROTO_IPV6
			}
			if bytes.Equal(udata, serviceEndpointMapUdata(fam, n)) {
				s.Endpoints, s.ByService = p, true
				return s, nil
			}
		}
		return nil, fmt.Errorf("set %s is a map from service and integer whose type kproxy does not know", s.Name)
	}
	for id := ktype; id != 0; id >>= dtBitsConcat {
		var t nft.DataType
		for name, dt := range dataTypes {
			if dt.id == id&(1<<dtBitsConcat-1) {
				t = name
			}
		}
		if t == "" {
			return nil, fmt.Errorf("set %s has a key type (%#x) kproxy does not use", s.Name, ktype)
		}
		s.Key = append([]nft.DataType{t}, s.Key...)
	}
	s.Interval = flags&setInterval != 0
	s.Dynamic = flags&setEval != 0
	if flags&setMap != 0 {
		if dtype != verdictData {
			return nil, fmt.Errorf("set %s is a map to data type %#x, not a verdict map", s.Name, dtype)
		}
		s.Data = nft.TypeVerdict
	}
	return s, nil
}

// TableExists reports whether the table exists.
func (n *Netlink) TableExists(ctx context.Context, family nft.Family, table string) (bool, error) {
	c, err := n.dial()
	if err != nil {
		return false, err
	}
	defer c.Close()
	return tableExists(ctx, c, family, table)
}

func tableExists(ctx context.Context, c *nlConn, family nft.Family, table string) (bool, error) {
	var a attrs
	a.str(unix.NFTA_TABLE_NAME, table)
	_, err := c.get(ctx, unix.NFT_MSG_GETTABLE, nfproto(family), a.b)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("nft: looking up table %s %s: %w", family, table, err)
	}
	return true, nil
}

// ListTables returns the names of the tables of a family, sorted.
func (n *Netlink) ListTables(ctx context.Context, family nft.Family) ([]string, error) {
	c, err := n.dial()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	replies, err := c.dump(ctx, unix.NFT_MSG_GETTABLE, nfproto(family), nil)
	if err != nil {
		return nil, fmt.Errorf("nft: listing tables of family %s: %w", family, err)
	}
	var names []string
	for _, r := range replies {
		forEachAttr(r, func(typ uint16, data []byte) {
			if typ == unix.NFTA_TABLE_NAME {
				names = append(names, cString(data))
			}
		})
	}
	slices.Sort(names)
	return names, nil
}

// ListChains returns the chain names of a table, sorted.
func (n *Netlink) ListChains(ctx context.Context, family nft.Family, table string) ([]string, error) {
	return n.listNames(ctx, family, table, unix.NFT_MSG_GETCHAIN, unix.NFTA_CHAIN_TABLE, unix.NFTA_CHAIN_NAME, 0)
}

// ListSets returns the names of the named sets and maps of a table, sorted.
func (n *Netlink) ListSets(ctx context.Context, family nft.Family, table string) ([]string, error) {
	return n.listNames(ctx, family, table, unix.NFT_MSG_GETSET, unix.NFTA_SET_TABLE, unix.NFTA_SET_NAME, unix.NFTA_SET_FLAGS)
}

func (n *Netlink) listNames(ctx context.Context, family nft.Family, table string, msg, tableAttr, nameAttr, flagsAttr uint16) ([]string, error) {
	c, err := n.dial()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ok, err := tableExists(ctx, c, family, table)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("nft: table %s %s: %w", family, table, nft.ErrNotFound)
	}
	var a attrs
	a.str(tableAttr, table)
	replies, err := c.dump(ctx, msg, nfproto(family), a.b)
	if err != nil {
		return nil, fmt.Errorf("nft: listing table %s %s: %w", family, table, err)
	}
	var names []string
	for _, r := range replies {
		var t, name string
		var flags uint32
		forEachAttr(r, func(typ uint16, data []byte) {
			switch typ {
			case tableAttr:
				t = cString(data)
			case nameAttr:
				name = cString(data)
			case flagsAttr:
				if flagsAttr != 0 && len(data) == 4 {
					flags = binary.BigEndian.Uint32(data)
				}
			}
		})
		if t == table && name != "" && flags&setAnonymous == 0 {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// DeleteTable deletes a table; a missing table is not an error.
func (n *Netlink) DeleteTable(ctx context.Context, family nft.Family, table string) error {
	tx := nft.NewTransaction(family, table)
	tx.Delete(&nft.Table{})
	err := n.Apply(ctx, tx)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}
