package nft

import (
	"encoding/binary"

	"golang.org/x/sys/unix"
)

// attrs builds a list of netlink attributes. nf_tables integers are big
// endian; attribute headers are host order.
type attrs struct{ b []byte }

func (a *attrs) put(typ uint16, data []byte) {
	l := nlaHdrLen + len(data)
	var h [nlaHdrLen]byte
	binary.NativeEndian.PutUint16(h[0:2], uint16(l))
	binary.NativeEndian.PutUint16(h[2:4], typ)
	a.b = append(a.b, h[:]...)
	a.b = append(a.b, data...)
	for len(a.b)%4 != 0 {
		a.b = append(a.b, 0)
	}
}

func (a *attrs) str(typ uint16, s string) {
	a.put(typ, append([]byte(s), 0))
}

func (a *attrs) u32(typ uint16, v uint32) {
	a.put(typ, binary.BigEndian.AppendUint32(nil, v))
}

func (a *attrs) u64(typ uint16, v uint64) {
	a.put(typ, binary.BigEndian.AppendUint64(nil, v))
}

// nest writes a nested attribute whose content fn produces. It returns
// the offset of the nested attribute's header within a.b.
func (a *attrs) nest(typ uint16, fn func(*attrs)) int {
	start := len(a.b)
	a.b = append(a.b, 0, 0, 0, 0)
	inner := attrs{b: a.b}
	fn(&inner)
	a.b = inner.b
	binary.NativeEndian.PutUint16(a.b[start:start+2], uint16(len(a.b)-start))
	binary.NativeEndian.PutUint16(a.b[start+2:start+4], typ|unix.NLA_F_NESTED)
	return start
}

// value writes an NFTA_DATA_VALUE nest (used for keys and cmp data).
func (a *attrs) value(typ uint16, data []byte) {
	a.nest(typ, func(n *attrs) { n.put(unix.NFTA_DATA_VALUE, data) })
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
