package nfnetlink

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

// keyType returns the nft key type id and length of a set key.
func keyType(key []nft.DataType) (id uint32, length int, err error) {
	if len(key) == 0 {
		return 0, 0, invalidf("set without key type")
	}
	if len(key) > 32/dtBitsConcat {
		return 0, 0, invalidf("too many concatenated key types")
	}
	for _, k := range key {
		dt, ok := dataTypes[k]
		if !ok {
			return 0, 0, invalidf("unsupported key type %q", k)
		}
		id = id<<dtBitsConcat | dt.id
		if len(key) > 1 {
			length += align4(dt.len) // each field fills whole 4-byte registers
		} else {
			length += dt.len
		}
	}
	return id, length, nil
}

func (l *lowerer) lowerSet(i int, op *nft.Op) error {
	s := op.Set
	var a attrs
	switch op.Kind {
	case nft.OpAdd:
		if err := nft.CheckComment(s.Comment); err != nil {
			return err
		}
		if s.Endpoints != "" {
			return l.lowerEndpointMap(i, s)
		}
		if s.IsMap() && s.Data != nft.TypeVerdict {
			return unsupportedf("only verdict maps are supported, not %q", s.Data)
		}
		if s.Interval && len(s.Key) > 1 {
			return unsupportedf("interval sets with concatenated keys are not supported")
		}
		ktype, klen, err := keyType(s.Key)
		if err != nil {
			return err
		}
		var flags uint32
		if s.Interval {
			flags |= setInterval
		}
		if s.IsMap() {
			flags |= setMap
		}
		if s.Dynamic || s.Timeout > 0 {
			flags |= setTimeout
		}
		if s.Dynamic {
			flags |= setEval
		}
		l.nextID++
		id := l.nextID
		a.str(unix.NFTA_SET_TABLE, l.cur)
		a.str(unix.NFTA_SET_NAME, s.Name)
		a.u32(unix.NFTA_SET_FLAGS, flags)
		a.u32(unix.NFTA_SET_KEY_TYPE, ktype)
		a.u32(unix.NFTA_SET_KEY_LEN, uint32(klen))
		if s.IsMap() {
			a.u32(unix.NFTA_SET_DATA_TYPE, verdictData)
			a.u32(unix.NFTA_SET_DATA_LEN, 0)
		}
		a.u32(unix.NFTA_SET_ID, id)
		if s.Timeout > 0 {
			a.u64(unix.NFTA_SET_TIMEOUT, uint64(s.Timeout.Milliseconds()))
		}
		a.put(unix.NFTA_SET_USERDATA, namedSetUdata(s))
		l.add(nlMsg{typ: unix.NFT_MSG_NEWSET, flags: unix.NLM_F_CREATE, family: l.fam, attrs: a.b, op: i})
		// "add set" of an existing set keeps its elements, so whether
		// the set is empty stays unknown until it matters.
		if si, ok := l.sets[l.ref(s.Name)]; ok {
			si.def, si.id = s, id
		} else {
			l.sets[l.ref(s.Name)] = &setInfo{def: s, id: id}
		}
	case nft.OpFlush:
		// nft resolves "flush set" among sets and "flush map" among maps
		// (ENOENT otherwise); the kernel does not care, but the text form
		// must work with nft too.
		if si, ok := l.sets[l.ref(s.Name)]; ok && si.def.IsMap() != s.IsMap() {
			return &nft.ErrnoError{Msg: fmt.Sprintf("%s is declared as a %s; flush it as one", s.Name, map[bool]string{true: "map", false: "set"}[si.def.IsMap()]), Errno: unix.ENOENT}
		}
		a.str(unix.NFTA_SET_ELEM_LIST_TABLE, l.cur)
		a.str(unix.NFTA_SET_ELEM_LIST_SET, s.Name)
		l.add(nlMsg{typ: unix.NFT_MSG_DELSETELEM, family: l.fam, attrs: a.b, op: i})
		if si, ok := l.sets[l.ref(s.Name)]; ok {
			si.empty = emptyYes
		}
	case nft.OpDelete:
		a.str(unix.NFTA_SET_TABLE, l.cur)
		a.str(unix.NFTA_SET_NAME, s.Name)
		l.add(nlMsg{typ: unix.NFT_MSG_DELSET, family: l.fam, attrs: a.b, op: i})
		delete(l.sets, l.ref(s.Name))
	}
	return nil
}

// endpointMapUdata is the user data nft 1.0.6 writes for "typeof numgen
// random mod 1 : ip daddr . tcp dport" (ip6 daddr; udp, sctp), byte for
// byte as captured with `nft --debug=mnl`: key byte order host, data byte
// order unset, the numgen key expression (type random, mod 1, offset 0)
// and the concatenation of two payload expressions, each (protocol
// description, field). nft needs it to list the map and to accept rules
// binding numgen to it.
func endpointMapUdata(fam uint8, proto uint8) []byte {
	u := []byte{
		0x00, 0x04, 0x01, 0x00, 0x00, 0x00, 0x01, 0x04, 0x00, 0x00, 0x00, 0x00,
		0x03, 0x1a, 0x00, 0x04, 0x17, 0x00, 0x00, 0x00, 0x01, 0x12, 0x00, 0x04,
		0x01, 0x00, 0x00, 0x00, 0x01, 0x04, 0x01, 0x00, 0x00, 0x00, 0x02, 0x04,
		0x00, 0x00, 0x00, 0x00, 0x04, 0x34, 0x00, 0x04, 0x0d, 0x00, 0x00, 0x00,
		0x01, 0x2c, 0x00, 0x14, 0x00, 0x04, 0x07, 0x00, 0x00, 0x00, 0x01, 0x0c,
		0x00, 0x04, protoDescIP, 0x00, 0x00, 0x00, 0x01, 0x04, ipHdrDaddr, 0x00, 0x00, 0x00,
		0x01, 0x14, 0x00, 0x04, 0x07, 0x00, 0x00, 0x00, 0x01, 0x0c, 0x00, 0x04,
		0x00, 0x00, 0x00, 0x00, 0x01, 0x04, 0x02, 0x00, 0x00, 0x00, 0x06, 0x04,
		0x00, 0x00, 0x00, 0x00,
	}
	if fam == unix.NFPROTO_IPV6 {
		u[62], u[68] = protoDescIP6, ip6HdrDaddr
	}
	u[84] = endpointProtoDesc[proto]
	return u
}

// serviceEndpointMapUdata is the user data nft 1.0.6 writes for "typeof
// ip daddr . tcp dport . numgen random mod 1 : ip daddr . tcp dport" (ip6
// daddr; udp, sctp), as captured with `nft --debug=mnl`: both byte
// orders unset (the key is a concatenation), the key a concatenation of
// two payload expressions and numgen, the data a concatenation of two
// payload expressions, and the data interval flag.
func serviceEndpointMapUdata(fam uint8, proto uint8) []byte {
	pdesc, daddr := byte(protoDescIP), byte(ipHdrDaddr)
	if fam == unix.NFPROTO_IPV6 {
		pdesc, daddr = protoDescIP6, ip6HdrDaddr
	}
	payload := func(desc, field byte) udata {
		return udata(nil).u32(udTypeofExpr, exprTypePayload).
			nest(udTypeofData, udata(nil).u32(0, uint32(desc)).u32(1, uint32(field)))
	}
	addr := payload(pdesc, daddr)
	port := payload(endpointProtoDesc[proto], thDport)
	numgen := udata(nil).u32(udTypeofExpr, exprTypeNumgen).
		nest(udTypeofData, udata(nil).u32(0, unix.NFT_NG_RANDOM).u32(1, 1).u32(2, 0))
	key := udata(nil).u32(udTypeofExpr, exprTypeConcat).
		nest(udTypeofData, udata(nil).nest(0, addr).nest(1, port).nest(2, numgen))
	data := udata(nil).u32(udTypeofExpr, exprTypeConcat).
		nest(udTypeofData, udata(nil).nest(0, addr).nest(1, port))
	return udata(nil).u32(udSetKeyByteorder, byteorderInvalid).u32(udSetDataByteorder, byteorderInvalid).
		nest(udSetKeyTypeof, key).nest(udSetDataTypeof, data).u32(udSetDataInterval, 0)
}

// endpointProtoDesc is nft's protocol description id (proto_tcp, ...) of
// a transport protocol number.
var endpointProtoDesc = map[uint8]byte{unix.IPPROTO_TCP: 0x08, unix.IPPROTO_UDP: 0x06, unix.IPPROTO_SCTP: 0x0a}

// endpointData is the data of an endpoint map element: the address and
// the port (big endian), each filling whole 4-byte registers, as in a
// concatenation.
func endpointData(to netip.AddrPort) []byte {
	a := to.Addr().AsSlice()
	b := make([]byte, len(a)+4)
	copy(b, a)
	binary.BigEndian.PutUint16(b[len(a):], to.Port())
	return b
}

// lowerEndpointMap lowers "add map ... { typeof numgen random mod 1 :
// ip daddr . th dport ; }" (see Set.Endpoints).
func (l *lowerer) lowerEndpointMap(i int, s *nft.Set) error {
	p, ok := ProtoNumber(s.Endpoints)
	if !ok {
		return invalidf("unknown protocol %q", s.Endpoints)
	}
	if len(s.Key) > 0 || s.Data != "" || s.Interval || s.Dynamic || s.Timeout > 0 {
		return invalidf("an endpoint map has no key, data type, flags or timeout of its own")
	}
	if s.Comment != "" {
		return unsupportedf("endpoint maps with comments are not supported")
	}
	alen := 4
	at := uint32(dtIPv4Addr)
	if l.fam == unix.NFPROTO_IPV6 {
		alen, at = 16, dtIPv6Addr
	}
	ktype, klen := uint32(dtInteger), 4
	ud := endpointMapUdata(l.fam, p)
	if s.ByService {
		// ADDR . PORT . INTEGER, each in whole 4-byte registers.
		ktype = (at<<dtBitsConcat|dtInetService)<<dtBitsConcat | dtInteger
		klen = alen + 4 + 4
		ud = serviceEndpointMapUdata(l.fam, p)
	}
	l.nextID++
	id := l.nextID
	var a attrs
	a.str(unix.NFTA_SET_TABLE, l.cur)
	a.str(unix.NFTA_SET_NAME, s.Name)
	a.u32(unix.NFTA_SET_FLAGS, setMap)
	a.u32(unix.NFTA_SET_KEY_TYPE, ktype)
	a.u32(unix.NFTA_SET_KEY_LEN, uint32(klen))
	a.u32(unix.NFTA_SET_DATA_TYPE, at<<dtBitsConcat|dtInetService)
	a.u32(unix.NFTA_SET_DATA_LEN, uint32(alen+4))
	a.u32(unix.NFTA_SET_ID, id)
	a.put(unix.NFTA_SET_USERDATA, ud)
	l.add(nlMsg{typ: unix.NFT_MSG_NEWSET, flags: unix.NLM_F_CREATE, family: l.fam, attrs: a.b, op: i})
	if si, ok := l.sets[l.ref(s.Name)]; ok {
		si.def, si.id = s, id
	} else {
		l.sets[l.ref(s.Name)] = &setInfo{def: s, id: id}
	}
	return nil
}

// namedSetUdata is the user data nft 1.0.x stores with a named set
// declared by "type": the key byte order, for maps the data byte order
// and interval flag, and for concatenations a "typeof" stub.
func namedSetUdata(s *nft.Set) []byte {
	var u udata
	if len(s.Key) > 1 {
		u = u.u32(udSetKeyByteorder, byteorderInvalid)
	} else {
		u = u.u32(udSetKeyByteorder, dataTypes[s.Key[0]].byteorder)
	}
	if s.IsMap() {
		u = u.u32(udSetDataByteorder, byteorderInvalid)
	}
	if len(s.Key) > 1 {
		u = u.nest(udSetKeyTypeof, udata(nil).u32(udTypeofExpr, exprTypeConcat).nest(udTypeofData, nil))
	}
	if s.IsMap() {
		u = u.u32(udSetDataInterval, 0)
	}
	if s.Comment != "" {
		u = u.str(udSetComment, s.Comment)
	}
	return u
}
