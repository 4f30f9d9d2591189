package nfnetlink

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

// ruleBuilder writes the expressions of one rule into its message and
// notes where each starts and which statement it comes from (to name the
// statement the kernel refuses).
type ruleBuilder struct {
	a      *attrs
	starts []int
	stmts  []int
	cur    int
	// l4proto the rule has already matched: nft omits the implicit
	// "meta l4proto" dependency of "tcp dport" when it is known.
	l4proto uint8
}

// next notes that an expression of the current statement starts here and
// returns the buffer to write it to.
func (r *ruleBuilder) next() *attrs {
	r.starts = append(r.starts, len(r.a.b))
	r.stmts = append(r.stmts, r.cur)
	return r.a
}

// loadConcat loads fields into consecutive registers, as nft lays out a
// concatenation: each field starts at a 4-byte register boundary.
func (l *lowerer) loadConcat(rb *ruleBuilder, fields []nft.Field) error {
	slot := 0
	for _, f := range fields {
		reg := concatReg(slot)
		switch f {
		case nft.FieldDaddr, nft.FieldSaddr:
			off, n := addrField(l.fam, f == nft.FieldSaddr)
			rb.next().payloadLoad(reg, unix.NFT_PAYLOAD_NETWORK_HEADER, off, n)
			slot += int(n) / 4
		case nft.FieldL4Proto:
			rb.next().metaLoad(unix.NFT_META_L4PROTO, reg)
			slot++
		case nft.FieldDport:
			rb.next().payloadLoad(reg, unix.NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2)
			slot++
		default:
			return invalidf("unknown field %q", f)
		}
	}
	return nil
}

// ne32 is v in host byte order, as nft compares marks, numgen values and
// other host order integers.
func ne32(v uint32) [4]byte {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], v)
	return b
}

func native32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

// addrBytes returns a's bytes (4 or 16) in buf.
func addrBytes(buf *[16]byte, a netip.Addr) []byte {
	if a.Is4() {
		b := a.As4()
		copy(buf[:], b[:])
		return buf[:4]
	}
	*buf = a.As16()
	return buf[:]
}

func (l *lowerer) lowerRule(i int, op *nft.Op) error {
	r := op.Rule
	if op.Kind != nft.OpAdd && op.Kind != nft.OpInsert {
		return invalidf("rules can only be added or inserted (flush or delete their chain instead)")
	}
	if err := nft.CheckComment(r.Comment); err != nil {
		return err
	}
	a := &l.scratch
	a.b = a.b[:0]
	a.str(unix.NFTA_RULE_TABLE, l.cur)
	a.str(unix.NFTA_RULE_CHAIN, r.Chain)
	rb := ruleBuilder{a: a, starts: l.starts[:0], stmts: l.stmtIdx[:0]}
	list := a.open()
	for si, s := range r.Stmts {
		rb.cur = si
		if err := l.lowerStmt(i, &rb, s); err != nil {
			return fmt.Errorf("statement %q: %w", nft.StmtText(l.tx.Family, s), err)
		}
	}
	a.close(list, unix.NFTA_RULE_EXPRESSIONS)
	if r.Comment != "" {
		// udata(nil).str(udComment, r.Comment), written in place.
		a.hdr(unix.NFTA_RULE_USERDATA, 2+len(r.Comment)+1)
		a.b = append(a.b, udComment, byte(len(r.Comment)+1))
		a.b = append(a.b, r.Comment...)
		a.b = append(a.b, 0)
		a.pad()
	}
	flags := uint16(unix.NLM_F_CREATE | unix.NLM_F_APPEND)
	if op.Kind == nft.OpInsert {
		// Without NLM_F_APPEND and without a position the kernel puts the
		// rule first in its chain.
		flags = unix.NLM_F_CREATE
	}
	l.add(nlMsg{typ: unix.NFT_MSG_NEWRULE, flags: flags, family: l.fam, op: i,
		attrs: a.b, exprStarts: l.keepInts(rb.starts), exprStmts: l.keepInts(rb.stmts)})
	// The scratch buffers keep their capacity for the next rule.
	l.starts, l.stmtIdx = rb.starts, rb.stmts
	return nil
}

// addrField returns the payload offset and length of ip/ip6 saddr/daddr.
func addrField(f uint8, source bool) (off, length uint32) {
	if f == unix.NFPROTO_IPV6 {
		if source {
			return 8, 16
		}
		return 24, 16
	}
	if source {
		return 12, 4
	}
	return 16, 4
}

func (l *lowerer) loadAddr(rb *ruleBuilder, source bool, reg uint32) {
	off, n := addrField(l.fam, source)
	rb.next().payloadLoad(reg, unix.NFT_PAYLOAD_NETWORK_HEADER, off, n)
}

func cmpOp(negate bool) uint32 {
	if negate {
		return unix.NFT_CMP_NEQ
	}
	return unix.NFT_CMP_EQ
}

func (l *lowerer) checkFamily(a netip.Addr) error {
	if (l.fam == unix.NFPROTO_IPV6) == a.Is4() {
		return invalidf("address %s does not belong to table family %s", a, l.tx.Family)
	}
	return nil
}

// matchL4Proto is "meta l4proto P", remembered for later "dport" matches.
func (rb *ruleBuilder) matchL4Proto(p uint8) {
	rb.next().metaLoad(unix.NFT_META_L4PROTO, reg1)
	rb.next().cmp(unix.NFT_CMP_EQ, reg1, []byte{p})
	rb.l4proto = p
}

func (l *lowerer) lowerStmt(op int, rb *ruleBuilder, s nft.Stmt) error {
	zero := ne32(0)
	switch s := s.(type) {
	case nft.MatchCtStateNew:
		mask := ne32(ctStateNew)
		rb.next().ctLoad(unix.NFT_CT_STATE, reg1)
		rb.next().bitwise(reg1, reg1, mask[:], zero[:])
		rb.next().cmp(unix.NFT_CMP_NEQ, reg1, zero[:])
	case nft.MatchAddr:
		return l.lowerMatchAddr(op, rb, s)
	case nft.MatchL4Proto:
		p, ok := ProtoNumber(s.Proto)
		if !ok {
			return invalidf("unknown protocol %q", s.Proto)
		}
		rb.matchL4Proto(p)
	case nft.MatchDport:
		// "tcp dport 80" carries its protocol dependency (meta l4proto
		// tcp in ip/ip6 tables); nft lists the pair as "tcp dport 80".
		p, ok := ProtoNumber(s.Proto)
		if !ok {
			return invalidf("unknown protocol %q", s.Proto)
		}
		switch rb.l4proto {
		case 0:
			rb.matchL4Proto(p)
		case p:
		default:
			return invalidf("conflicting protocols: the rule already matched protocol %d", rb.l4proto)
		}
		port := binary.BigEndian.AppendUint16(make([]byte, 0, 2), s.Port)
		rb.next().payloadLoad(reg1, unix.NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2)
		rb.next().cmp(unix.NFT_CMP_EQ, reg1, port)
	case nft.MatchFibLocal:
		flags := uint32(unix.NFTA_FIB_F_DADDR)
		if s.Source {
			flags = unix.NFTA_FIB_F_SADDR
		}
		local := ne32(rtnLocal)
		rb.next().fib(reg1, flags, unix.NFT_FIB_RESULT_ADDRTYPE)
		rb.next().cmp(unix.NFT_CMP_EQ, reg1, local[:])
	case nft.MatchIifname:
		if s.Name == "" && s.Prefix {
			return invalidf("all-wildcard interface names are not supported")
		}
		if len(s.Name) >= ifnameLen {
			return invalidf("interface name %q is too long", s.Name)
		}
		var buf [ifnameLen]byte
		n := copy(buf[:], s.Name)
		data := buf[:]
		if s.Prefix {
			data = buf[:n]
		}
		rb.next().metaLoad(unix.NFT_META_IIFNAME, reg1)
		rb.next().cmp(cmpOp(s.Negate), reg1, data)
	case nft.MatchMarkZero:
		mask := ne32(s.Mask)
		rb.next().metaLoad(unix.NFT_META_MARK, reg1)
		rb.next().bitwise(reg1, reg1, mask[:], zero[:])
		rb.next().cmp(unix.NFT_CMP_EQ, reg1, zero[:])
	case nft.SetMarkOr:
		mask, xor := ne32(^s.Mask), ne32(s.Mask)
		rb.next().metaLoad(unix.NFT_META_MARK, reg1)
		rb.next().bitwise(reg1, reg1, mask[:], xor[:])
		rb.next().metaSet(unix.NFT_META_MARK, reg1)
	case nft.SetMarkXor:
		mask, xor := ne32(0xffffffff), ne32(s.Mask)
		rb.next().metaLoad(unix.NFT_META_MARK, reg1)
		rb.next().bitwise(reg1, reg1, mask[:], xor[:])
		rb.next().metaSet(unix.NFT_META_MARK, reg1)
	case nft.Masquerade:
		rb.next().masqFullyRandom()
	case nft.DNAT:
		p, ok := ProtoNumber(s.Proto)
		if !ok {
			return invalidf("unknown protocol %q", s.Proto)
		}
		if !s.To.Addr().IsValid() {
			return invalidf("invalid DNAT address")
		}
		if err := l.checkFamily(s.To.Addr()); err != nil {
			return err
		}
		var abuf [16]byte
		port := binary.BigEndian.AppendUint16(make([]byte, 0, 2), s.To.Port())
		rb.matchL4Proto(p)
		rb.next().immediate(reg1, addrBytes(&abuf, s.To.Addr()))
		rb.next().immediate(reg2, port)
		rb.next().dnat(uint32(l.fam), reg1, reg2)
	case nft.DNATMap:
		p, ok := ProtoNumber(s.Proto)
		if !ok {
			return invalidf("unknown protocol %q", s.Proto)
		}
		if s.Mod == 0 || s.Offset+s.Mod < s.Offset {
			return invalidf("numgen mod %d offset %d", s.Mod, s.Offset)
		}
		// nft refuses a rule whose protocol differs from the map's.
		if si, ok := l.sets[l.ref(s.Map)]; ok && (si.def.Endpoints != s.Proto || si.def.ByService) {
			return invalidf("%s is not an endpoint map of %s", s.Map, s.Proto)
		}
		rb.matchL4Proto(p)
		rb.next().numgenRandomOffset(reg1, s.Mod, s.Offset)
		rb.next().lookup(reg1, reg1, false, s.Map, l.batchID(s.Map))
		// The port follows the address in the data: 4-byte slot 1 (ip)
		// or 4 (ip6), as nft allocates it.
		slot := 1
		if l.fam == unix.NFPROTO_IPV6 {
			slot = 4
		}
		rb.next().dnat(uint32(l.fam), reg1, concatReg(slot))
	case nft.DNATByService:
		p, ok := ProtoNumber(s.Proto)
		if !ok {
			return invalidf("unknown protocol %q", s.Proto)
		}
		if s.Mod == 0 {
			return invalidf("numgen mod 0")
		}
		if si, ok := l.sets[l.ref(s.Map)]; ok && (si.def.Endpoints != s.Proto || !si.def.ByService) {
			return invalidf("%s is not an endpoint map of %s keyed by service", s.Map, s.Proto)
		}
		// The key is a concatenation: the address from slot 0, the port
		// and numgen's value in the 4-byte slots after it, as nft
		// allocates them; the port of the data lands in the same slot
		// as the port of the key.
		rb.matchL4Proto(p)
		off, n := addrField(l.fam, false)
		slot := int(n) / 4
		rb.next().payloadLoad(reg1, unix.NFT_PAYLOAD_NETWORK_HEADER, off, n)
		rb.next().payloadLoad(concatReg(slot), unix.NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2)
		rb.next().numgenRandom(concatReg(slot+1), s.Mod)
		rb.next().lookup(reg1, reg1, false, s.Map, l.batchID(s.Map))
		rb.next().dnat(uint32(l.fam), reg1, concatReg(slot))
	case nft.UpdateSaddr:
		l.loadAddr(rb, true, reg1)
		rb.next().dynsetUpdate(reg1, s.Set, l.batchID(s.Set))
	case nft.MatchInSet:
		if len(s.Fields) == 0 {
			return invalidf("set lookup without fields")
		}
		if err := l.loadConcat(rb, s.Fields); err != nil {
			return err
		}
		rb.next().lookup(reg1, -1, false, s.Set, l.batchID(s.Set))
	case nft.VmapLookup:
		if len(s.Fields) == 0 {
			return invalidf("vmap lookup without fields")
		}
		if err := l.loadConcat(rb, s.Fields); err != nil {
			return err
		}
		rb.next().lookup(reg1, regVerdict, false, s.Map, l.batchID(s.Map))
	case nft.NumgenVmap:
		if len(s.Chains) == 0 {
			return invalidf("numgen vmap without chains")
		}
		elems := make([]elemAttr, len(s.Chains))
		for i, c := range s.Chains {
			elems[i] = elemAttr{key: native32(uint32(i)), verdict: &nft.Verdict{Kind: nft.Goto, Chain: c}}
		}
		// numgen yields a host byte order integer; the anonymous map
		// records only its verdict "typeof".
		u := udata(nil).u32(udSetKeyByteorder, byteorderHost).u32(udSetDataByteorder, byteorderInvalid).
			nest(udSetDataTypeof, udata(nil).u32(udTypeofExpr, exprTypeVerdict).nest(udTypeofData, nil)).
			u32(udSetDataInterval, 0)
		id := l.anonSet(op, setMap, dtInteger, 4, u, elems)
		rb.next().numgenRandom(reg1, uint32(len(s.Chains)))
		rb.next().lookup(reg1, regVerdict, false, "__map%d", id)
	case nft.MatchNumgen:
		if s.Mod == 0 || s.Value >= s.Mod {
			return invalidf("numgen random mod %d %d can never match", s.Mod, s.Value)
		}
		// numgen yields a host byte order integer, compared as nft does.
		v := ne32(s.Value)
		rb.next().numgenRandom(reg1, s.Mod)
		rb.next().cmp(unix.NFT_CMP_EQ, reg1, v[:])
	case nft.Reject:
		// Plain "reject" in an ip/ip6 table is ICMP port unreachable.
		code := uint8(icmpPortUnreach)
		if l.fam == unix.NFPROTO_IPV6 {
			code = icmp6PortUnreach
		}
		rb.next().reject(unix.NFT_REJECT_ICMP_UNREACH, code)
	case nft.Counter:
		rb.next().counter()
	case nft.Verdict:
		code, err := verdictCode(s.Kind)
		if err != nil {
			return err
		}
		chain := ""
		if s.Kind == nft.Jump || s.Kind == nft.Goto {
			if s.Chain == "" {
				return invalidf("%s without a chain", s.Kind)
			}
			chain = s.Chain
		}
		rb.next().verdictExpr(code, chain)
	default:
		return unsupportedf("unsupported statement %T", s)
	}
	return nil
}

// lowerMatchAddr lowers "ip saddr|daddr [!=] ..." the way nft's
// evaluator does: one address is a full-width compare; a prefix on a
// byte boundary compares only its leading bytes; any other prefix masks
// first; several values become an anonymous set (an interval set with
// merged ranges when any value is a real prefix); a one-value set is the
// value itself.
func (l *lowerer) lowerMatchAddr(op int, rb *ruleBuilder, s nft.MatchAddr) error {
	off, n := addrField(l.fam, s.Source)
	if s.Set != "" {
		l.loadAddr(rb, s.Source, reg1)
		rb.next().lookup(reg1, -1, s.Negate, s.Set, l.batchID(s.Set))
		return nil
	}
	if len(s.Prefixes) == 0 {
		return invalidf("address match without addresses")
	}
	for _, p := range s.Prefixes {
		if !p.IsValid() {
			return invalidf("invalid prefix")
		}
		if err := l.checkFamily(p.Addr()); err != nil {
			return err
		}
	}
	if len(s.Prefixes) == 1 {
		p := s.Prefixes[0].Masked()
		bits := p.Bits()
		var abuf [16]byte
		addr := addrBytes(&abuf, p.Addr())
		switch {
		case p.IsSingleIP():
			l.loadAddr(rb, s.Source, reg1)
			rb.next().cmp(cmpOp(s.Negate), reg1, addr)
		case bits > 0 && bits%8 == 0:
			rb.next().payloadLoad(reg1, unix.NFT_PAYLOAD_NETWORK_HEADER, off, uint32(bits/8))
			rb.next().cmp(cmpOp(s.Negate), reg1, addr[:bits/8])
		default:
			var mask, xor [16]byte
			for i := 0; i < bits; i++ {
				mask[i/8] |= 0x80 >> (i % 8)
			}
			l.loadAddr(rb, s.Source, reg1)
			rb.next().bitwise(reg1, reg1, mask[:n], xor[:n])
			rb.next().cmp(cmpOp(s.Negate), reg1, addr)
		}
		return nil
	}

	interval := false
	for _, p := range s.Prefixes {
		if !p.IsSingleIP() {
			interval = true
		}
	}
	ktype, kname := uint32(dtIPv4Addr), nft.TypeIPv4Addr
	proto, field := uint32(protoDescIP), uint32(ipHdrDaddr)
	if s.Source {
		field = ipHdrSaddr
	}
	if l.fam == unix.NFPROTO_IPV6 {
		ktype, kname = dtIPv6Addr, nft.TypeIPv6Addr
		proto, field = protoDescIP6, ip6HdrDaddr
		if s.Source {
			field = ip6HdrSaddr
		}
	}
	var elems []elemAttr
	var flags uint32
	u := udata(nil).u32(udSetKeyByteorder, byteorderBig)
	if interval {
		flags = setInterval
		u = u.u32(udSetMergeElements, 1)
		rs := make([]addrRange, len(s.Prefixes))
		for i, p := range s.Prefixes {
			rs[i] = prefixRange(p)
		}
		elems = intervalElems(mergeRanges(rs), true, nil)
	} else {
		// Duplicates are sent as they are (the kernel accepts re-adding
		// an element); nft counts them in the set size too.
		for _, p := range s.Prefixes {
			elems = append(elems, elemAttr{key: p.Addr().AsSlice()})
		}
	}
	u = u.nest(udSetKeyTypeof, udata(nil).u32(udTypeofExpr, exprTypePayload).
		nest(udTypeofData, udata(nil).u32(0, proto).u32(1, field)))
	id := l.anonSet(op, flags, ktype, dataTypes[kname].len, u, elems)
	l.loadAddr(rb, s.Source, reg1)
	rb.next().lookup(reg1, -1, s.Negate, "__set%d", id)
	return nil
}
