package nfnetlink

import (
	"encoding/binary"
	"net/netip"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

// elemAttr is one set element in netlink form.
type elemAttr struct {
	key     []byte
	end     bool // NFT_SET_ELEM_INTERVAL_END
	open    bool // a range up to the top of the address space, which has no end element
	verdict *nft.Verdict
	data    []byte // endpoint map elements
	comment string
}

func (e *elemAttr) encode(a *attrs) {
	elem := a.open()
	if e.end {
		a.u32(unix.NFTA_SET_ELEM_FLAGS, unix.NFT_SET_ELEM_INTERVAL_END)
	}
	a.value(unix.NFTA_SET_ELEM_KEY, e.key)
	if e.verdict != nil {
		d := a.open()
		encodeVerdict(a, *e.verdict)
		a.close(d, unix.NFTA_SET_ELEM_DATA)
	}
	if e.data != nil {
		a.value(unix.NFTA_SET_ELEM_DATA, e.data)
	}
	// nft records a comment, and marks a range without end element as
	// open (NFTNL_SET_ELEM_F_INTERVAL_OPEN): udata written in place.
	n := 0
	if e.comment != "" {
		n += 2 + len(e.comment) + 1
	}
	if e.open {
		n += 2 + 4
	}
	if n > 0 {
		a.hdr(unix.NFTA_SET_ELEM_USERDATA, n)
		if e.comment != "" {
			a.b = append(a.b, udComment, byte(len(e.comment)+1))
			a.b = append(a.b, e.comment...)
			a.b = append(a.b, 0)
		}
		if e.open {
			a.b = append(a.b, udElemFlags, 4)
			a.b = binary.NativeEndian.AppendUint32(a.b, elemFlagIntervalOpen)
		}
		a.pad()
	}
	a.close(elem, unix.NFTA_LIST_ELEM)
}

func verdictCode(k nft.VerdictKind) (int32, error) {
	switch k {
	case nft.Accept:
		return nfAccept, nil
	case nft.Drop:
		return nfDrop, nil
	case nft.Return:
		return unix.NFT_RETURN, nil
	case nft.Jump:
		return unix.NFT_JUMP, nil
	case nft.Goto:
		return unix.NFT_GOTO, nil
	}
	return 0, invalidf("unknown verdict %q", k)
}

func encodeVerdict(a *attrs, v nft.Verdict) {
	code, _ := verdictCode(v.Kind) // checked by callers
	n := a.open()
	a.u32(unix.NFTA_VERDICT_CODE, uint32(code))
	if v.Kind == nft.Jump || v.Kind == nft.Goto {
		a.str(unix.NFTA_VERDICT_CHAIN, v.Chain)
	}
	a.close(n, unix.NFTA_DATA_VERDICT)
}

// valueBytes encodes one key component of type t.
func valueBytes(t nft.DataType, v nft.Value) ([]byte, error) { return appendValue(nil, t, v) }

// appendValue appends one key component of type t to b.
func appendValue(b []byte, t nft.DataType, v nft.Value) ([]byte, error) {
	switch t {
	case nft.TypeIPv4Addr, nft.TypeIPv6Addr:
		var a netip.Addr
		switch {
		case v.Addr.IsValid():
			a = v.Addr
		case v.Prefix.IsValid():
			a = v.Prefix.Masked().Addr()
		default:
			return b, invalidf("%s key component %q is not an address", t, v)
		}
		if (t == nft.TypeIPv4Addr) != a.Is4() {
			return b, invalidf("%s key component %q has the wrong address family", t, v)
		}
		if a.Is4() {
			a4 := a.As4()
			return append(b, a4[:]...), nil
		}
		a16 := a.As16()
		return append(b, a16[:]...), nil
	case nft.TypeInetProto:
		p, ok := ProtoNumber(v.Proto)
		if !ok {
			return b, invalidf("inet_proto key component %q is not a protocol", v)
		}
		return append(b, p), nil
	case nft.TypeInetService:
		if v.Addr.IsValid() || v.Prefix.IsValid() || v.Proto != "" {
			return b, invalidf("inet_service key component %q is not a port", v)
		}
		return binary.BigEndian.AppendUint16(b, v.Port), nil
	}
	return b, invalidf("unsupported key type %q", t)
}

// keyBytes encodes a whole (possibly concatenated) key.
func keyBytes(types []nft.DataType, key []nft.Value) ([]byte, error) {
	return appendKeyBytes(nil, types, key)
}

// appendKeyBytes appends a whole key to b: each field of a concatenation
// padded to 4 bytes.
func appendKeyBytes(b []byte, types []nft.DataType, key []nft.Value) ([]byte, error) {
	if len(key) != len(types) {
		return b, invalidf("key has %d components, the set's type has %d", len(key), len(types))
	}
	var err error
	for i, t := range types {
		if b, err = appendValue(b, t, key[i]); err != nil {
			return b, err
		}
		if len(types) > 1 {
			for len(b)%4 != 0 {
				b = append(b, 0)
			}
		}
	}
	return b, nil
}

// addrRange is a closed interval of addresses, as nft's segment tree
// handles them.
type addrRange struct{ lo, hi netip.Addr }

func prefixRange(p netip.Prefix) addrRange {
	p = p.Masked()
	lo := p.Addr()
	b := lo.AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	hi, _ := netip.AddrFromSlice(b)
	return addrRange{lo, hi}
}

func valueRange(v nft.Value) (addrRange, bool) {
	switch {
	case v.Addr.IsValid():
		return addrRange{v.Addr, v.Addr}, true
	case v.Prefix.IsValid():
		return prefixRange(v.Prefix), true
	}
	return addrRange{}, false
}

// mergeRanges sorts ranges and joins overlapping and adjacent ones, as
// nft does for anonymous interval sets ("automerge").
func mergeRanges(rs []addrRange) []addrRange {
	slices.SortFunc(rs, func(a, b addrRange) int { return a.lo.Compare(b.lo) })
	var out []addrRange
	for _, r := range rs {
		if n := len(out); n > 0 {
			last := &out[n-1]
			if next := last.hi.Next(); r.lo.Compare(last.hi) <= 0 || (next.IsValid() && next == r.lo) {
				if r.hi.Compare(last.hi) > 0 {
					last.hi = r.hi
				}
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// intervalElems expands ranges to the start/end element pairs the kernel
// stores for an interval set: the start key, and the key after the last
// address flagged as an end (omitted when the range reaches the top of
// the address space). firstSegment adds nft's leading end element at
// zero, which nft sends when it fills an empty set.
func intervalElems(rs []addrRange, firstSegment bool, data func(i int) (*nft.Verdict, string)) []elemAttr {
	var out []elemAttr
	if firstSegment && len(rs) > 0 && !rs[0].lo.IsUnspecified() {
		zero := make([]byte, rs[0].lo.BitLen()/8)
		out = append(out, elemAttr{key: zero, end: true})
	}
	for i, r := range rs {
		var v *nft.Verdict
		var c string
		if data != nil {
			v, c = data(i)
		}
		next := r.hi.Next()
		out = append(out, elemAttr{key: r.lo.AsSlice(), verdict: v, comment: c, open: !next.IsValid()})
		if next.IsValid() {
			out = append(out, elemAttr{key: next.AsSlice(), end: true})
		}
	}
	return out
}

// lowerElements lowers ops[from:to], all element operations of one kind
// on one set.
func (l *lowerer) lowerElements(from, to int) error {
	ops := l.tx.Ops
	kind := ops[from].Kind
	name := ops[from].Element.Set
	if kind == nft.OpFlush {
		return invalidf("elements cannot be flushed; flush the set")
	}
	si, err := l.set(name)
	if err != nil {
		return err
	}
	opErr := func(i int, err error) error { return &nft.OpError{Index: i, Op: l.tx.OpText(i), Err: err} }
	elems := l.elems[:0]
	owners := l.owners[:0]
	// Keys of earlier calls are encoded already: a new buffer, not
	// overwritten (slices of the old one may still be referenced).
	l.keyBuf = make([]byte, 0, 16*(to-from))
	defer func() { l.elems, l.owners = elems[:0], owners[:0] }()
	if si == nil {
		// The set does not exist: send the elements anyway and let the
		// kernel reject them (ENOENT), as it would nft's. The key is
		// encoded from the values alone.
		for i := from; i < to; i++ {
			var key []byte
			if e := ops[i].Element; e.IsEndpoint() {
				// An endpoint map of an earlier transaction.
				k, err := endpointKey(e)
				if err != nil {
					return opErr(i, err)
				}
				ea := elemAttr{key: k}
				if kind == nft.OpAdd {
					ea.data = endpointData(e.To)
				}
				elems = append(elems, ea)
				owners = append(owners, i)
				continue
			}
			for _, v := range ops[i].Element.Key {
				b, err := valueBytes(guessType(v), v)
				if err != nil {
					return opErr(i, err)
				}
				key = append(key, b...)
			}
			elems = append(elems, elemAttr{key: key})
			owners = append(owners, i)
		}
		l.elementMsgs(elemMsgType(kind), name, 0, elems, owners)
		return nil
	}

	def := si.def
	var ranges []addrRange // interval sets
	var rangeData []elemAttr
	for i := from; i < to; i++ {
		e := ops[i].Element
		if err := nft.CheckComment(e.Comment); err != nil {
			return opErr(i, err)
		}
		if (def.Endpoints != "") != e.IsEndpoint() || (e.IsEndpoint() && ((len(e.Key) > 0) != def.ByService || e.Verdict != nil)) {
			if def.ByService {
				return opErr(i, invalidf("an endpoint map keyed by service holds exactly the elements ADDR . PORT . INDEX : ADDR . PORT"))
			}
			return opErr(i, invalidf("an endpoint map holds exactly the elements INDEX : ADDR . PORT"))
		}
		if def.Endpoints != "" {
			if err := l.checkFamily(e.To.Addr()); err != nil {
				return opErr(i, err)
			}
			k, err := endpointKey(e)
			if err != nil {
				return opErr(i, err)
			}
			if len(e.Key) > 0 {
				if err := l.checkFamily(e.Key[0].Addr); err != nil {
					return opErr(i, err)
				}
			}
			ea := elemAttr{key: k}
			if kind == nft.OpAdd {
				ea.data = endpointData(e.To)
			}
			elems = append(elems, ea)
			owners = append(owners, i)
			continue
		}
		if def.IsMap() && kind == nft.OpAdd && e.Verdict == nil {
			return opErr(i, invalidf("map element without a verdict"))
		}
		if !def.IsMap() && e.Verdict != nil {
			return opErr(i, invalidf("set element with a verdict"))
		}
		if e.Verdict != nil {
			if _, err := verdictCode(e.Verdict.Kind); err != nil {
				return opErr(i, err)
			}
		}
		ea := elemAttr{}
		if kind == nft.OpAdd {
			ea.verdict, ea.comment = e.Verdict, e.Comment
		}
		if def.Interval {
			if len(e.Key) != 1 {
				return opErr(i, invalidf("key has %d components, the set's type has 1", len(e.Key)))
			}
			if _, err := valueBytes(def.Key[0], e.Key[0]); err != nil {
				return opErr(i, err)
			}
			r, _ := valueRange(e.Key[0])
			ranges = append(ranges, r)
			rangeData = append(rangeData, ea)
			owners = append(owners, i)
			continue
		}
		for _, kv := range e.Key {
			if kv.Prefix.IsValid() {
				return opErr(i, invalidf("prefix %s in a set without the interval flag", kv.Prefix))
			}
		}
		// Keys are cut from one buffer per call (they only live until
		// elementMsgs has encoded them).
		start := len(l.keyBuf)
		if l.keyBuf, err = appendKeyBytes(l.keyBuf, def.Key, e.Key); err != nil {
			return opErr(i, err)
		}
		ea.key = l.keyBuf[start:len(l.keyBuf):len(l.keyBuf)]
		elems = append(elems, ea)
		owners = append(owners, i)
	}

	if def.Interval {
		// Each range becomes a start element and (unless it reaches the
		// top of the address space) an end element. Filling an empty set,
		// nft first adds an end element at zero unless a range starts
		// there.
		first := false
		if kind == nft.OpAdd {
			empty, err := l.isEmpty(name, si)
			if err != nil {
				return opErr(from, err)
			}
			first = empty
			for _, r := range ranges {
				if r.lo.IsUnspecified() {
					first = false
				}
			}
		}
		var rOwners []int
		if first && len(ranges) > 0 {
			elems = append(elems, elemAttr{key: make([]byte, ranges[0].lo.BitLen()/8), end: true})
			rOwners = append(rOwners, owners[0])
		}
		for k, r := range ranges {
			for _, ea := range intervalElems([]addrRange{r}, false, func(int) (*nft.Verdict, string) {
				return rangeData[k].verdict, rangeData[k].comment
			}) {
				elems = append(elems, ea)
				rOwners = append(rOwners, owners[k])
			}
		}
		owners = rOwners
	}
	if kind == nft.OpAdd && len(elems) > 0 {
		si.empty = emptyNo
	}
	if kind == nft.OpDelete {
		si.empty = emptyUnknown
	}
	l.elementMsgs(elemMsgType(kind), name, si.id, elems, owners)
	return nil
}

// endpointKey is the key of an endpoint map element: the index in host
// byte order (numgen's), after the service's address and port (each in
// whole 4-byte registers) in a map keyed by service.
func endpointKey(e *nft.Element) ([]byte, error) {
	if len(e.Key) == 0 {
		return native32(e.Index), nil
	}
	if len(e.Key) != 2 || !e.Key[0].Addr.IsValid() || e.Key[1].Addr.IsValid() || e.Key[1].Prefix.IsValid() || e.Key[1].Proto != "" {
		return nil, invalidf("an endpoint map key is ADDR . PORT . INDEX")
	}
	t := nft.TypeIPv4Addr
	if e.Key[0].Addr.Is6() {
		t = nft.TypeIPv6Addr
	}
	b, err := appendKeyBytes(nil, []nft.DataType{t, nft.TypeInetService}, e.Key)
	if err != nil {
		return nil, err
	}
	return binary.NativeEndian.AppendUint32(b, e.Index), nil
}

// guessType is the data type a key component would have in a set of
// unknown type.
func guessType(v nft.Value) nft.DataType {
	switch {
	case v.Addr.IsValid() && v.Addr.Is4(), v.Prefix.IsValid() && v.Prefix.Addr().Is4():
		return nft.TypeIPv4Addr
	case v.Addr.IsValid(), v.Prefix.IsValid():
		return nft.TypeIPv6Addr
	case v.Proto != "":
		return nft.TypeInetProto
	}
	return nft.TypeInetService
}

type elemMsg struct{ typ, flags uint16 }

func elemMsgType(k nft.OpKind) elemMsg {
	if k == nft.OpDelete {
		return elemMsg{unix.NFT_MSG_DELSETELEM, 0}
	}
	return elemMsg{unix.NFT_MSG_NEWSETELEM, unix.NLM_F_CREATE}
}

// elementMsgs splits an element list into messages whose element nest
// stays below the 64 KiB attribute limit.
func (l *lowerer) elementMsgs(mt elemMsg, set string, setID uint32, elems []elemAttr, owners []int) {
	// Not l.scratch: an anonymous set's elements are lowered in the
	// middle of their rule.
	a := &l.elemScratch
	for start := 0; start < len(elems); {
		a.b = a.b[:0]
		a.str(unix.NFTA_SET_ELEM_LIST_TABLE, l.cur)
		a.str(unix.NFTA_SET_ELEM_LIST_SET, set)
		if setID != 0 {
			a.u32(unix.NFTA_SET_ELEM_LIST_SET_ID, setID)
		}
		list := a.open()
		m := nlMsg{typ: mt.typ, flags: mt.flags, family: l.fam, op: owners[start]}
		starts, ops := l.elemStarts[:0], l.elemOps[:0]
		end := start
		for end < len(elems) && (end == start || len(a.b)-list-nlaHdrLen < maxAttrBytes-1024) {
			starts = append(starts, len(a.b))
			ops = append(ops, owners[end])
			elems[end].encode(a)
			end++
		}
		a.close(list, unix.NFTA_SET_ELEM_LIST_ELEMENTS)
		m.attrs, m.elemStarts, m.elemOps = a.b, l.keepInts(starts), l.keepInts(ops)
		l.elemStarts, l.elemOps = starts, ops
		l.add(m)
		start = end
	}
}

// anonSet creates an anonymous constant set or map in the batch and
// returns its id. keyUdata is the "typeof" description of the key.
func (l *lowerer) anonSet(op int, flags uint32, ktype uint32, klen int, keyUdata []byte, elems []elemAttr) uint32 {
	l.nextID++
	id := l.nextID
	name := "__set%d"
	if flags&setMap != 0 {
		name = "__map%d"
	}
	var a attrs
	a.str(unix.NFTA_SET_TABLE, l.cur)
	a.str(unix.NFTA_SET_NAME, name)
	a.u32(unix.NFTA_SET_FLAGS, flags|setAnonymous|setConstant)
	a.u32(unix.NFTA_SET_KEY_TYPE, ktype)
	a.u32(unix.NFTA_SET_KEY_LEN, uint32(klen))
	if flags&setMap != 0 {
		a.u32(unix.NFTA_SET_DATA_TYPE, verdictData)
		a.u32(unix.NFTA_SET_DATA_LEN, 0)
	}
	a.u32(unix.NFTA_SET_ID, id)
	a.nest(unix.NFTA_SET_DESC, func(n *attrs) { n.u32(unix.NFTA_SET_DESC_SIZE, uint32(len(elems))) })
	a.put(unix.NFTA_SET_USERDATA, keyUdata)
	l.add(nlMsg{typ: unix.NFT_MSG_NEWSET, flags: unix.NLM_F_CREATE, family: l.fam, attrs: a.b, op: op})
	owners := make([]int, len(elems))
	for i := range owners {
		owners[i] = op
	}
	l.elementMsgs(elemMsgType(nft.OpAdd), name, id, elems, owners)
	return id
}
