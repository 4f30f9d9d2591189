package nft

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// This file prints transactions in the syntax `nft -f` reads. The same text
// is what `kproxy render --proxy-mode nftables` shows and what the tracer
// parses, so it must stay stable and unambiguous: one operation per line.

// String renders the whole transaction, one operation per line.
func (t *Transaction) String() string {
	var b strings.Builder
	// Most lines are 60-120 bytes: one allocation for most transactions
	// instead of a dozen doublings of a large one.
	b.Grow(96 * len(t.Ops))
	t.WriteTo(&b)
	return b.String()
}

// WriteTo writes the transaction text to b.
func (t *Transaction) WriteTo(b *strings.Builder) {
	for i := range t.Ops {
		t.writeOp(b, &t.Ops[i])
		b.WriteByte('\n')
	}
}

func (t *Transaction) writeOp(b *strings.Builder, op *Op) {
	b.WriteString(string(op.Kind))
	b.WriteByte(' ')
	fam := string(t.Family)
	tbl := t.TableOf(op)
	// famTable is "FAMILY TABLE", written after every object keyword: a
	// transaction on several tables is one `nft -f` file, applied by nft
	// as one kernel transaction too.
	famTable := func() {
		b.WriteString(fam)
		b.WriteByte(' ')
		b.WriteString(tbl)
	}
	switch {
	case op.Table != nil:
		b.WriteString("table ")
		famTable()
		if op.Kind == OpAdd && op.Table.Comment != "" {
			b.WriteString(" { comment ")
			writeQuoted(b, op.Table.Comment)
			b.WriteString(" ; }")
		}
	case op.Chain != nil:
		c := op.Chain
		b.WriteString("chain ")
		famTable()
		b.WriteByte(' ')
		b.WriteString(c.Name)
		if op.Kind == OpAdd && (c.Hook != "" || c.Comment != "") {
			b.WriteString(" {")
			if c.Hook != "" {
				fmt.Fprintf(b, " type %s hook %s priority %d ;", c.Type, c.Hook, c.Priority)
			}
			if c.Comment != "" {
				b.WriteString(" comment ")
				writeQuoted(b, c.Comment)
				b.WriteString(" ;")
			}
			b.WriteString(" }")
		}
	case op.Set != nil:
		s := op.Set
		kind := "set"
		if s.IsMap() {
			kind = "map"
		}
		b.WriteString(kind)
		b.WriteByte(' ')
		famTable()
		b.WriteByte(' ')
		b.WriteString(s.Name)
		if op.Kind == OpAdd && s.Endpoints != "" {
			b.WriteString(" { typeof ")
			if s.ByService {
				b.WriteString(addrKeyword(t.Family))
				b.WriteString(" daddr . ")
				b.WriteString(ProtoName(s.Endpoints))
				b.WriteString(" dport . ")
			}
			b.WriteString("numgen random mod 1 : ")
			b.WriteString(addrKeyword(t.Family))
			b.WriteString(" daddr . ")
			b.WriteString(ProtoName(s.Endpoints))
			b.WriteString(" dport ;")
			if s.Comment != "" {
				fmt.Fprintf(b, " comment %s ;", quote(s.Comment))
			}
			b.WriteString(" }")
		} else if op.Kind == OpAdd {
			b.WriteString(" { type ")
			for i, k := range s.Key {
				if i > 0 {
					b.WriteString(" . ")
				}
				b.WriteString(string(k))
			}
			if s.IsMap() {
				b.WriteString(" : ")
				b.WriteString(string(s.Data))
			}
			b.WriteString(" ;")
			var flags []string
			if s.Interval {
				flags = append(flags, "interval")
			}
			if s.Dynamic {
				flags = append(flags, "dynamic", "timeout")
			}
			if len(flags) > 0 {
				fmt.Fprintf(b, " flags %s ;", strings.Join(flags, ","))
			}
			if s.Timeout > 0 {
				fmt.Fprintf(b, " timeout %ds ;", int64(s.Timeout.Seconds()))
			}
			if s.Comment != "" {
				fmt.Fprintf(b, " comment %s ;", quote(s.Comment))
			}
			b.WriteString(" }")
		}
	case op.Element != nil:
		e := op.Element
		// "add element" works for sets and maps alike.
		b.WriteString("element ")
		famTable()
		b.WriteByte(' ')
		b.WriteString(e.Set)
		b.WriteString(" { ")
		if e.IsEndpoint() {
			writeEndpointElem(b, e)
			b.WriteString(" }")
			break
		}
		writeKey(b, e.Key)
		if e.Comment != "" && op.Kind == OpAdd {
			b.WriteString(" comment ")
			writeQuoted(b, e.Comment)
		}
		if e.Verdict != nil && op.Kind == OpAdd {
			b.WriteString(" : ")
			writeVerdict(b, *e.Verdict)
		}
		b.WriteString(" }")
	case op.Rule != nil:
		r := op.Rule
		b.WriteString("rule ")
		famTable()
		b.WriteByte(' ')
		b.WriteString(r.Chain)
		for _, s := range r.Stmts {
			b.WriteByte(' ')
			writeStmt(b, t.Family, s)
		}
		if r.Comment != "" {
			b.WriteString(" comment ")
			writeQuoted(b, r.Comment)
		}
	}
}

// writeEndpointElem writes "[KEY . ]INDEX : ADDR . PORT", the data in
// deletions too (see Element.To).
func writeEndpointElem(b *strings.Builder, e *Element) {
	var buf [64]byte
	if len(e.Key) > 0 {
		writeKey(b, e.Key)
		b.WriteString(" . ")
	}
	b.Write(strconv.AppendUint(buf[:0], uint64(e.Index), 10))
	b.WriteString(" : ")
	b.Write(e.To.Addr().AppendTo(buf[:0]))
	b.WriteString(" . ")
	b.Write(strconv.AppendUint(buf[:0], uint64(e.To.Port()), 10))
}

func quote(s string) string { return strconv.Quote(s) }

// writeQuoted writes quote(s) without building the quoted string first.
func writeQuoted(b *strings.Builder, s string) {
	var buf [64]byte
	b.Write(strconv.AppendQuote(buf[:0], s))
}

func writeKey(b *strings.Builder, key []Value) {
	var buf [64]byte
	for i, v := range key {
		if i > 0 {
			b.WriteString(" . ")
		}
		// Addresses and ports are the common case: formatted in place.
		switch {
		case v.Addr.IsValid():
			b.Write(v.Addr.AppendTo(buf[:0]))
		case !v.Prefix.IsValid() && v.Proto == "":
			b.Write(strconv.AppendUint(buf[:0], uint64(v.Port), 10))
		default:
			b.WriteString(v.String())
		}
	}
}

// String prints one key component.
func (v Value) String() string {
	switch {
	case v.Addr.IsValid():
		return v.Addr.String()
	case v.Prefix.IsValid():
		return prefixString(v.Prefix)
	case v.Proto != "":
		return ProtoName(v.Proto)
	default:
		return strconv.Itoa(int(v.Port))
	}
}

// ProtoName is the protocol as nft writes it: strings.ToLower, without an
// allocation for the three Kubernetes has.
func ProtoName(p v1.Protocol) string {
	switch p {
	case v1.ProtocolTCP:
		return "tcp"
	case v1.ProtocolUDP:
		return "udp"
	case v1.ProtocolSCTP:
		return "sctp"
	}
	return strings.ToLower(string(p))
}

func prefixString(p netip.Prefix) string {
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.String()
}

func writeVerdict(b *strings.Builder, v Verdict) {
	b.WriteString(string(v.Kind))
	if v.Kind == Jump || v.Kind == Goto {
		b.WriteByte(' ')
		b.WriteString(v.Chain)
	}
}

func addrKeyword(f Family) string {
	if f == IPv6 {
		return "ip6"
	}
	return "ip"
}

func fieldString(f Family, fl Field) string {
	switch fl {
	case FieldDaddr:
		return addrKeyword(f) + " daddr"
	case FieldSaddr:
		return addrKeyword(f) + " saddr"
	case FieldL4Proto:
		return "meta l4proto"
	case FieldDport:
		return "th dport"
	}
	return string(fl)
}

// StmtText is a statement in nft's text form (for messages).
func StmtText(f Family, s Stmt) string {
	var b strings.Builder
	writeStmt(&b, f, s)
	return b.String()
}

func writeStmt(b *strings.Builder, f Family, s Stmt) {
	switch s := s.(type) {
	case MatchCtStateNew:
		b.WriteString("ct state new")
	case MatchAddr:
		if s.Source {
			b.WriteString(fieldString(f, FieldSaddr))
		} else {
			b.WriteString(fieldString(f, FieldDaddr))
		}
		if s.Negate {
			b.WriteString(" !=")
		}
		b.WriteByte(' ')
		switch {
		case s.Set != "":
			b.WriteByte('@')
			b.WriteString(s.Set)
		case len(s.Prefixes) == 1:
			b.WriteString(prefixString(s.Prefixes[0]))
		default:
			b.WriteString("{ ")
			for i, p := range s.Prefixes {
				if i > 0 {
					b.WriteString(", ")
				}
				b.WriteString(prefixString(p))
			}
			b.WriteString(" }")
		}
	case MatchL4Proto:
		b.WriteString("meta l4proto ")
		b.WriteString(ProtoName(s.Proto))
	case MatchDport:
		var buf [8]byte
		b.WriteString(ProtoName(s.Proto))
		b.WriteString(" dport ")
		b.Write(strconv.AppendUint(buf[:0], uint64(s.Port), 10))
	case MatchFibLocal:
		if s.Source {
			b.WriteString("fib saddr type local")
		} else {
			b.WriteString("fib daddr type local")
		}
	case MatchIifname:
		b.WriteString("iifname ")
		if s.Negate {
			b.WriteString("!= ")
		}
		name := s.Name
		if s.Prefix {
			name += "*"
		}
		b.WriteString(quote(name))
	case MatchMarkZero:
		fmt.Fprintf(b, "meta mark & 0x%08x == 0", s.Mask)
	case SetMarkOr:
		fmt.Fprintf(b, "meta mark set meta mark | 0x%08x", s.Mask)
	case SetMarkXor:
		fmt.Fprintf(b, "meta mark set meta mark ^ 0x%08x", s.Mask)
	case Masquerade:
		b.WriteString("masquerade fully-random")
	case DNAT:
		var buf [64]byte
		b.WriteString("meta l4proto ")
		b.WriteString(ProtoName(s.Proto))
		b.WriteString(" dnat to ")
		if s.To.Addr().IsValid() {
			b.Write(s.To.AppendTo(buf[:0]))
		} else {
			b.WriteString(s.To.String()) // "invalid AddrPort"; AppendTo writes nothing
		}
	case DNATMap:
		var buf [24]byte
		b.WriteString("meta l4proto ")
		b.WriteString(ProtoName(s.Proto))
		b.WriteString(" dnat ")
		b.WriteString(addrKeyword(f))
		b.WriteString(" to numgen random mod ")
		b.Write(strconv.AppendUint(buf[:0], uint64(s.Mod), 10))
		b.WriteString(" offset ")
		b.Write(strconv.AppendUint(buf[:0], uint64(s.Offset), 10))
		b.WriteString(" map @")
		b.WriteString(s.Map)
	case DNATByService:
		var buf [24]byte
		b.WriteString("meta l4proto ")
		b.WriteString(ProtoName(s.Proto))
		b.WriteString(" dnat ")
		b.WriteString(addrKeyword(f))
		b.WriteString(" to ")
		b.WriteString(addrKeyword(f))
		b.WriteString(" daddr . th dport . numgen random mod ")
		b.Write(strconv.AppendUint(buf[:0], uint64(s.Mod), 10))
		b.WriteString(" map @")
		b.WriteString(s.Map)
	case UpdateSaddr:
		fmt.Fprintf(b, "update @%s { %s }", s.Set, fieldString(f, FieldSaddr))
	case VmapLookup:
		for i, fl := range s.Fields {
			if i > 0 {
				b.WriteString(" . ")
			}
			b.WriteString(fieldString(f, fl))
		}
		b.WriteString(" vmap @" + s.Map)
	case NumgenVmap:
		fmt.Fprintf(b, "numgen random mod %d vmap { ", len(s.Chains))
		for i, c := range s.Chains {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(b, "%d : goto %s", i, c)
		}
		b.WriteString(" }")
	case MatchInSet:
		for i, fl := range s.Fields {
			if i > 0 {
				b.WriteString(" . ")
			}
			b.WriteString(fieldString(f, fl))
		}
		b.WriteString(" @" + s.Set)
	case MatchNumgen:
		var buf [24]byte
		b.WriteString("numgen random mod ")
		b.Write(strconv.AppendUint(buf[:0], uint64(s.Mod), 10))
		b.WriteByte(' ')
		b.Write(strconv.AppendUint(buf[:0], uint64(s.Value), 10))
	case Reject:
		b.WriteString("reject")
	case Counter:
		b.WriteString("counter")
	case Verdict:
		writeVerdict(b, s)
	default:
		panic(fmt.Sprintf("nft: no text form for %T", s))
	}
}
