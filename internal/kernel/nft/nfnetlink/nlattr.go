package nfnetlink

import (
	"encoding/binary"

	"golang.org/x/sys/unix"
)

// attrs builds a list of netlink attributes. nf_tables integers are big
// endian; attribute headers are host order.
//
// Every method appends to b in place and allocates nothing but the
// growth of b: a full sync lowers millions of attributes, and one small
// allocation each (a header, a big-endian integer, a copy of a nested
// list) was most of its cost.
type attrs struct{ b []byte }

// hdr appends an attribute header for n bytes of payload.
func (a *attrs) hdr(typ uint16, n int) {
	a.b = binary.NativeEndian.AppendUint16(a.b, uint16(nlaHdrLen+n))
	a.b = binary.NativeEndian.AppendUint16(a.b, typ)
}

// pad aligns b to 4 bytes.
func (a *attrs) pad() {
	for len(a.b)%4 != 0 {
		a.b = append(a.b, 0)
	}
}

func (a *attrs) put(typ uint16, data []byte) {
	a.hdr(typ, len(data))
	a.b = append(a.b, data...)
	a.pad()
}

func (a *attrs) str(typ uint16, s string) {
	a.hdr(typ, len(s)+1)
	a.b = append(a.b, s...)
	a.b = append(a.b, 0)
	a.pad()
}

func (a *attrs) u32(typ uint16, v uint32) {
	a.hdr(typ, 4)
	a.b = binary.BigEndian.AppendUint32(a.b, v)
}

func (a *attrs) u64(typ uint16, v uint64) {
	a.hdr(typ, 8)
	a.b = binary.BigEndian.AppendUint64(a.b, v)
}

// open starts a nested attribute; close(start, typ) ends it. They are
// nest without a function value, for the hottest paths.
func (a *attrs) open() int {
	start := len(a.b)
	a.b = append(a.b, 0, 0, 0, 0)
	return start
}

func (a *attrs) close(start int, typ uint16) {
	binary.NativeEndian.PutUint16(a.b[start:start+2], uint16(len(a.b)-start))
	binary.NativeEndian.PutUint16(a.b[start+2:start+4], typ|unix.NLA_F_NESTED)
}

// nest writes a nested attribute whose content fn appends to a. It
// returns the offset of the nested attribute's header within a.b.
func (a *attrs) nest(typ uint16, fn func(*attrs)) int {
	start := a.open()
	fn(a)
	a.close(start, typ)
	return start
}

// value writes an NFTA_DATA_VALUE nest (used for keys and cmp data).
func (a *attrs) value(typ uint16, data []byte) {
	start := a.open()
	a.put(unix.NFTA_DATA_VALUE, data)
	a.close(start, typ)
}

// udata builds libnftnl "user data": type, length, value TLVs that nft
// stores alongside objects (comments, set key byte order, ...). The
// kernel keeps them verbatim; only nft reads them back.
type udata []byte

func (u udata) str(typ byte, s string) udata {
	u = append(u, typ, byte(len(s)+1))
	u = append(u, s...)
	return append(u, 0)
}

func (u udata) u32(typ byte, v uint32) udata {
	u = append(u, typ, 4)
	return binary.NativeEndian.AppendUint32(u, v)
}

func (u udata) nest(typ byte, inner udata) udata {
	u = append(u, typ, byte(len(inner)))
	return append(u, inner...)
}
