package nftstate

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/nft/nfnetlink"
)

func addrLen(t nft.DataType) int {
	if t == nft.TypeIPv6Addr {
		return 16
	}
	return 4
}

// keyLen is the length of a set key as the kernel sees it: concatenated
// components each take whole 4-byte registers.
func keyLen(key []nft.DataType) int {
	n := 0
	for _, t := range key {
		switch t {
		case nft.TypeIPv4Addr, nft.TypeIPv6Addr:
			n += addrLen(t)
		case nft.TypeInetProto:
			n++
		case nft.TypeInetService:
			n += 2
		}
		if len(key) > 1 {
			n = (n + 3) &^ 3
		}
	}
	return n
}

var keyTypes = map[nft.DataType]bool{nft.TypeIPv4Addr: true, nft.TypeIPv6Addr: true, nft.TypeInetProto: true, nft.TypeInetService: true}

// sameSetFlags compares what the kernel refuses to change in an
// existing set: key, data and flags. (The timeout may change.)
func sameSetFlags(a, b *nft.Set) bool {
	timeoutFlag := func(s *nft.Set) bool { return s.Dynamic || s.Timeout > 0 }
	return slices.Equal(a.Key, b.Key) && a.Data == b.Data && a.Endpoints == b.Endpoints && a.ByService == b.ByService && a.Interval == b.Interval &&
		a.Dynamic == b.Dynamic && timeoutFlag(a) == timeoutFlag(b)
}

func (x *Txn) setOp(p *nft.Parsed) error {
	kind, s := p.Op.Kind, p.Op.Set
	if s.Name == "" {
		return kerr(unix.EINVAL, "set without a name")
	}
	old := x.t.Sets[s.Name]
	switch kind {
	case nft.OpAdd:
		if old != nil && p.Create {
			return kerr(unix.EEXIST, "set %s exists", s.Name)
		}
		if s.Endpoints != "" {
			if len(s.Key) > 0 || s.Data != "" || s.Interval || s.Dynamic || s.Timeout > 0 {
				return kerr(unix.EINVAL, "endpoint map %s: no key, data type, flags or timeout of its own", s.Name)
			}
			if s.Comment != "" {
				return kerr(unix.EOPNOTSUPP, "endpoint map %s: comments are not supported", s.Name)
			}
			if old == nil {
				x.t.AddSet(x.newSet(p))
			} else if !sameSetFlags(&old.Def, s) {
				return kerr(unix.EEXIST, "set %s exists with a different definition", s.Name)
			}
			return nil
		}
		if len(s.Key) == 0 {
			return kerr(unix.EINVAL, "set %s has no key type", s.Name)
		}
		for _, k := range s.Key {
			if !keyTypes[k] {
				return kerr(unix.EINVAL, "set %s: unsupported key type %q", s.Name, k)
			}
		}
		if s.IsMap() && s.Data != nft.TypeVerdict {
			return kerr(unix.EINVAL, "map %s: only verdict maps are supported", s.Name)
		}
		// kproxy's netlink lowering has neither of these (nfnetlink
		// refuses them before the kernel sees them); nft -f has.
		if x.dialect == Netlink && s.Interval && len(s.Key) > 1 {
			return kerr(unix.EOPNOTSUPP, "set %s: interval sets with concatenated keys are not supported", s.Name)
		}
		if x.dialect == Netlink && s.Interval && s.Key[0] != nft.TypeIPv4Addr && s.Key[0] != nft.TypeIPv6Addr {
			return kerr(unix.EOPNOTSUPP, "set %s: only address interval sets are supported", s.Name)
		}
		if old == nil {
			x.t.AddSet(x.newSet(p))
			return nil
		}
		// The kernel refuses to redefine a set but updates its timeout;
		// the comment of the existing one stays.
		if !sameSetFlags(&old.Def, s) {
			return kerr(unix.EEXIST, "set %s exists with a different definition", s.Name)
		}
		if s.Timeout > 0 {
			x.ownSet(old).Def.Timeout = s.Timeout
		}
	case nft.OpFlush:
		if old == nil {
			return kerr(unix.ENOENT, "set %s does not exist", s.Name)
		}
		// nft looks up "flush set" among sets and "flush map" among maps.
		if old.Def.IsMap() != s.IsMap() {
			return kerr(unix.ENOENT, "%s is a %s; flush it as one", s.Name, kindName(&old.Def))
		}
		x.ownSet(old).Flush()
	case nft.OpDelete:
		if old == nil {
			return kerr(unix.ENOENT, "set %s does not exist", s.Name)
		}
		for cn, c := range x.t.Chains {
			for _, r := range c.Rules {
				if slices.Contains(ruleSets(r.Rule), s.Name) {
					return kerr(unix.EBUSY, "set %s is still used by a rule in chain %s", s.Name, cn)
				}
			}
		}
		x.t.DeleteSet(s.Name)
	default:
		return kerr(unix.EINVAL, "unknown operation %q", kind)
	}
	return nil
}

func kindName(s *nft.Set) string {
	if s.IsMap() {
		return "map"
	}
	return "set"
}

// checkValue checks one key component against its type.
func checkValue(t nft.DataType, v nft.Value, interval bool) error {
	n := 0
	for _, set := range []bool{v.Addr.IsValid(), v.Prefix.IsValid(), v.Proto != ""} {
		if set {
			n++
		}
	}
	if n > 1 {
		return kerr(unix.EINVAL, "key component sets more than one field")
	}
	switch t {
	case nft.TypeIPv4Addr, nft.TypeIPv6Addr:
		var a netip.Addr
		switch {
		case v.Addr.IsValid():
			a = v.Addr
		case v.Prefix.IsValid():
			if !interval {
				return kerr(unix.EINVAL, "prefix %s in a set without the interval flag", v.Prefix)
			}
			a = v.Prefix.Addr()
		default:
			return kerr(unix.EINVAL, "%s key component %q is not an address", t, v)
		}
		if a.Is4() != (t == nft.TypeIPv4Addr) || a.Is4In6() {
			return kerr(unix.EINVAL, "%s key component %q has the wrong address family", t, v)
		}
	case nft.TypeInetProto:
		if _, ok := nfnetlink.ProtoNumber(v.Proto); !ok || n != 1 {
			return kerr(unix.EINVAL, "inet_proto key component %q is not a protocol", v)
		}
	case nft.TypeInetService:
		if n != 0 {
			return kerr(unix.EINVAL, "inet_service key component %q is not a port", v)
		}
	}
	return nil
}

func elemKey(key []nft.Value) string {
	var b strings.Builder
	for i, v := range key {
		if i > 0 {
			b.WriteString(" . ")
		}
		b.WriteString(v.String())
	}
	return b.String()
}

func valueRange(v nft.Value) (lo, hi netip.Addr) {
	if v.Addr.IsValid() {
		return v.Addr, v.Addr
	}
	p := v.Prefix.Masked()
	lo = p.Addr()
	b := lo.AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	hi, _ = netip.AddrFromSlice(b)
	return lo, hi
}

func sameVerdict(a, b *nft.Verdict) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func (x *Txn) newSet(p *nft.Parsed) *Set {
	s := NewSet(*p.Op.Set, x.t.Family)
	s.Line = p.Line
	x.owned[s] = true
	return s
}

func (x *Txn) elementOp(i int, p *nft.Parsed) error {
	kind, e := p.Op.Kind, p.Op.Element
	s := x.t.Sets[e.Set]
	if s == nil {
		return kerr(unix.ENOENT, "set %s does not exist", e.Set)
	}
	if kind == nft.OpFlush {
		return kerr(unix.EINVAL, "elements cannot be flushed")
	}
	if s.Def.Endpoints != "" || e.IsEndpoint() {
		return x.endpointElementOp(i, p, s)
	}
	if len(e.Key) != len(s.Def.Key) {
		return kerr(unix.EINVAL, "key has %d components, set %s has %d", len(e.Key), e.Set, len(s.Def.Key))
	}
	for i, t := range s.Def.Key {
		if err := checkValue(t, e.Key[i], s.Def.Interval); err != nil {
			return err
		}
	}
	// The identity of an interval element is its range: a /32 prefix
	// and its address are one element, as in the kernel.
	k := KeyID(e.Key)
	// Overlaps are checked for single addresses (nft -f may give
	// concatenated intervals, which overlap only in every field).
	ranges := s.Def.Interval && len(s.Def.Key) == 1
	var lo, hi netip.Addr
	if ranges {
		lo, hi = valueRange(e.Key[0])
	}
	old := s.Get(k)
	switch kind {
	case nft.OpAdd:
		if s.Def.IsMap() {
			if e.Verdict == nil {
				return kerr(unix.EINVAL, "map element without a verdict")
			}
			if x.dialect == Netlink {
				if err := x.checkJump(*e.Verdict); err != nil {
					return err
				}
			}
		} else if e.Verdict != nil {
			return kerr(unix.EINVAL, "set element with a verdict")
		}
		if old != nil && p.Create {
			return kerr(unix.EEXIST, "element %s exists in %s", elemKey(e.Key), e.Set)
		}
		if old != nil {
			// Adding an element that exists is fine if it maps to the
			// same verdict (its comment stays); else the kernel says
			// EEXIST.
			if !sameVerdict(old.Verdict, e.Verdict) {
				return kerr(unix.EEXIST, "element %s exists with a different verdict", elemKey(e.Key))
			}
			return nil
		}
		if ranges {
			for _, o := range s.Elems {
				okey := o.Key()
				olo, ohi := valueRange(okey[0])
				if lo.Compare(ohi) <= 0 && olo.Compare(hi) <= 0 {
					return kerr(unix.EEXIST, "interval %s overlaps %s", elemKey(e.Key), elemKey(okey))
				}
			}
		}
		// The element keeps its prefixes masked (as nft does: packKey)
		// and a verdict of its own.
		ne := NewElement(e)
		if e.Verdict != nil {
			v := *e.Verdict
			ne.Verdict = &v
		}
		x.addElement(i, s, ne)
	case nft.OpDelete:
		if old == nil {
			return kerr(unix.ENOENT, "element %s does not exist", elemKey(e.Key))
		}
		x.ownSet(s).Remove(k)
	default:
		return kerr(unix.EINVAL, "unknown operation %q", kind)
	}
	return nil
}

// endpointElementOp adds or deletes "INDEX : ADDR . PORT" in an endpoint
// map, keyed by INDEX.
func (x *Txn) endpointElementOp(i int, p *nft.Parsed, s *Set) error {
	kind, e := p.Op.Kind, p.Op.Element
	if s.Def.Endpoints == "" || !e.IsEndpoint() || e.Verdict != nil || (len(e.Key) > 0) != s.Def.ByService {
		if s.Def.ByService {
			return kerr(unix.EINVAL, "an endpoint map keyed by service holds exactly the elements ADDR . PORT . INDEX : ADDR . PORT (set %s)", e.Set)
		}
		return kerr(unix.EINVAL, "an endpoint map holds exactly the elements INDEX : ADDR . PORT (set %s)", e.Set)
	}
	if err := x.addrFamily(e.To.Addr()); err != nil {
		return err
	}
	k := strconv.FormatUint(uint64(e.Index), 10)
	if s.Def.ByService {
		if len(e.Key) != 2 || !e.Key[0].Addr.IsValid() || e.Key[1].Addr.IsValid() || e.Key[1].Prefix.IsValid() || e.Key[1].Proto != "" {
			return kerr(unix.EINVAL, "an endpoint map key is ADDR . PORT . INDEX (set %s)", e.Set)
		}
		if err := x.addrFamily(e.Key[0].Addr); err != nil {
			return err
		}
		k = elemKey(e.Key) + " . " + k
	}
	id := EndpointID(e.Key, e.Index)
	old := s.Get(id)
	switch kind {
	case nft.OpAdd:
		if old != nil && p.Create {
			return kerr(unix.EEXIST, "element %s exists in %s", k, e.Set)
		}
		if old != nil {
			if old.To() != e.To {
				return kerr(unix.EEXIST, "element %s exists with different data", k)
			}
			return nil
		}
		x.addElement(i, s, NewElement(e))
	case nft.OpDelete:
		if old == nil {
			return kerr(unix.ENOENT, "element %s does not exist", k)
		}
		x.ownSet(s).Remove(id)
	default:
		return kerr(unix.EINVAL, "unknown operation %q", kind)
	}
	return nil
}

// addElement stores an element the transaction adds.
func (x *Txn) addElement(i int, s *Set, e *Element) {
	x.ownSet(s).Add(e)
	x.addedElems[e] = i
}
