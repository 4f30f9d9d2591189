package nftstate

import (
	"encoding/binary"
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

// A stored element keeps its key packed into a string, one component
// after another, each a tag and its bytes; an endpoint map element's
// index and data (To) after them; its comment last. What comes before
// the data is usually the element's ID too (in the identity variant),
// the key of its set's index, so that an element costs its key's bytes
// once. As an nft.Element (its key as []nft.Value, 80 bytes a
// component) with a text ID beside it, the ~190k elements of a hollow
// node at 10k services took ~45 MB of the in-memory kernel; packed,
// with a 32-byte Element, ~11 MB.
const (
	tagAddr4   = 'a' // 4 bytes
	tagAddr16  = 'A' // 16 bytes
	tagPrefix4 = 'p' // prefix length, then 4 bytes (masked)
	tagPrefix6 = 'P' // prefix length, then 16 bytes (masked)
	tagProto   = 'r' // length, then the protocol's name
	tagPort    = 'n' // 2 bytes, big-endian
	tagIndex   = '#' // 4 bytes, big-endian: an endpoint map element's index
	// An endpoint map element's data (To), after its identity.
	tagTo4  = '>' // 4 bytes, then the port, 2 bytes
	tagTo16 = ')' // 16 bytes, then the port
	// The element's comment, last: its length (2 bytes), then its text.
	tagComment = 'c'
)

// appendValue appends one packed component. For an identity (id) a
// full-length prefix is its address, as the kernel holds it: one element
// either way. Prefixes are masked in both forms, as nft stores them, and
// protocols spelled as Kubernetes does (nft's "tcp" is one with "TCP").
func appendValue(b []byte, v nft.Value, id bool) []byte {
	switch {
	case v.Addr.IsValid():
		return appendAddr(b, v.Addr)
	case v.Prefix.IsValid():
		p := v.Prefix.Masked()
		if id && p.IsSingleIP() {
			return appendAddr(b, p.Addr())
		}
		if p.Addr().Is4() {
			a := p.Addr().As4()
			return append(append(b, tagPrefix4, byte(p.Bits())), a[:]...)
		}
		a := p.Addr().As16()
		return append(append(b, tagPrefix6, byte(p.Bits())), a[:]...)
	case v.Proto != "":
		name := string(canonProto(v.Proto))
		name = name[:min(len(name), 255)] // longer is no protocol
		return append(append(b, tagProto, byte(len(name))), name...)
	default:
		return binary.BigEndian.AppendUint16(append(b, tagPort), v.Port)
	}
}

// canonProto is the Kubernetes spelling of the protocols it has.
func canonProto(p v1.Protocol) v1.Protocol {
	switch nft.ProtoName(p) {
	case "tcp":
		return v1.ProtocolTCP
	case "udp":
		return v1.ProtocolUDP
	case "sctp":
		return v1.ProtocolSCTP
	}
	return p
}

func appendAddr(b []byte, a netip.Addr) []byte {
	if a.Is4() {
		x := a.As4()
		return append(append(b, tagAddr4), x[:]...)
	}
	x := a.As16()
	return append(append(b, tagAddr16), x[:]...)
}

// packKey packs key, and the index of an endpoint map element (endpoint).
func packKey(key []nft.Value, endpoint bool, index uint32, id bool) string {
	return string(appendKey(make([]byte, 0, 24), key, endpoint, index, id))
}

func appendKey(b []byte, key []nft.Value, endpoint bool, index uint32, id bool) []byte {
	for _, v := range key {
		b = appendValue(b, v, id)
	}
	if endpoint {
		b = binary.BigEndian.AppendUint32(append(b, tagIndex), index)
	}
	return b
}

// appendTo appends an endpoint map element's data.
func appendTo(b []byte, to netip.AddrPort) []byte {
	if a := to.Addr(); a.Is4() {
		x := a.As4()
		b = append(append(b, tagTo4), x[:]...)
	} else {
		x := a.As16()
		b = append(append(b, tagTo16), x[:]...)
	}
	return binary.BigEndian.AppendUint16(b, to.Port())
}

// appendComment appends an element's comment (none when empty).
func appendComment(b []byte, c string) []byte {
	if c == "" {
		return b
	}
	c = c[:min(len(c), 0xffff)] // nft allows 128 bytes (nft.CheckComment)
	return append(binary.BigEndian.AppendUint16(append(b, tagComment), uint16(len(c))), c...)
}

// unpacked is what a packed element holds.
type unpacked struct {
	key     []nft.Value
	index   uint32
	to      netip.AddrPort
	comment string
}

// unpack is what packKey and appendTo packed (a key packed as an ID
// comes back with its full-length prefixes as addresses); withKey false
// skips the key.
func unpack(s string, withKey bool) unpacked {
	var u unpacked
	n := 0
	for i := 0; withKey && i < len(s); i = next(s, i) {
		switch s[i] {
		case tagIndex, tagTo4, tagTo16, tagComment:
		default:
			n++
		}
	}
	if n > 0 {
		u.key = make([]nft.Value, 0, n)
	}
	for i := 0; i < len(s); i = next(s, i) {
		switch s[i] {
		case tagIndex:
			u.index = uint32(s[i+1])<<24 | uint32(s[i+2])<<16 | uint32(s[i+3])<<8 | uint32(s[i+4])
			continue
		case tagTo4:
			u.to = netip.AddrPortFrom(addr4(s[i+1:]), port(s[i+5:]))
			continue
		case tagTo16:
			u.to = netip.AddrPortFrom(addr16(s[i+1:]), port(s[i+17:]))
			continue
		case tagComment:
			u.comment = s[i+3 : i+3+int(port(s[i+1:]))]
			continue
		}
		if !withKey {
			continue
		}
		switch s[i] {
		case tagAddr4:
			u.key = append(u.key, nft.Value{Addr: addr4(s[i+1:])})
		case tagAddr16:
			u.key = append(u.key, nft.Value{Addr: addr16(s[i+1:])})
		case tagPrefix4:
			u.key = append(u.key, nft.Value{Prefix: netip.PrefixFrom(addr4(s[i+2:]), int(s[i+1]))})
		case tagPrefix6:
			u.key = append(u.key, nft.Value{Prefix: netip.PrefixFrom(addr16(s[i+2:]), int(s[i+1]))})
		case tagProto:
			u.key = append(u.key, nft.Value{Proto: v1.Protocol(s[i+2 : i+2+int(s[i+1])])})
		case tagPort:
			u.key = append(u.key, nft.Value{Port: port(s[i+1:])})
		}
	}
	return u
}

func port(s string) uint16 { return uint16(s[0])<<8 | uint16(s[1]) }

func addr4(s string) netip.Addr {
	var a [4]byte
	copy(a[:], s)
	return netip.AddrFrom4(a)
}

func addr16(s string) netip.Addr {
	var a [16]byte
	copy(a[:], s)
	return netip.AddrFrom16(a)
}

// next is where the component after the one at i starts.
func next(s string, i int) int {
	switch s[i] {
	case tagAddr4, tagIndex:
		return i + 5
	case tagAddr16:
		return i + 17
	case tagPrefix4:
		return i + 6
	case tagPrefix6:
		return i + 18
	case tagProto:
		return i + 2 + int(s[i+1])
	case tagPort:
		return i + 3
	case tagTo4:
		return i + 7
	case tagTo16:
		return i + 19
	case tagComment:
		return i + 3 + int(port(s[i+1:]))
	}
	panic("nftstate: corrupt packed key")
}

// KeyID is the identity of an element of key in a set that is not an
// endpoint map (Set.Get).
func KeyID(key []nft.Value) string { return packKey(key, false, 0, true) }

// EndpointID is the identity of an endpoint map element: its index, after
// the service's address and port in a map keyed by service.
func EndpointID(svc []nft.Value, index uint32) string { return packKey(svc, true, index, true) }

// KeyText is a key as text.go prints it, host bits of prefixes masked (a
// full-length prefix prints as its address).
func KeyText(key []nft.Value) string {
	parts := make([]string, len(key))
	for i, v := range key {
		if v.Prefix.IsValid() {
			v.Prefix = v.Prefix.Masked()
		}
		parts[i] = v.String()
	}
	return strings.Join(parts, " . ")
}
