package nft

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// This file prints transactions in the syntax `nft -f` reads. The same text
// is what `kproxy render --proxy-mode nftables` shows and what the tracer
// parses, so it must stay stable and unambiguous: one operation per line.

// String renders the whole transaction, one operation per line.
func (t *Transaction) String() string {
	var b strings.Builder
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
	switch {
	case op.Table != nil:
		fmt.Fprintf(b, "table %s %s", fam, t.Table)
		if op.Kind == OpAdd && op.Table.Comment != "" {
			fmt.Fprintf(b, " { comment %s ; }", quote(op.Table.Comment))
		}
	case op.Chain != nil:
		c := op.Chain
		fmt.Fprintf(b, "chain %s %s %s", fam, t.Table, c.Name)
		if op.Kind == OpAdd && (c.Hook != "" || c.Comment != "") {
			b.WriteString(" {")
			if c.Hook != "" {
				fmt.Fprintf(b, " type %s hook %s priority %d ;", c.Type, c.Hook, c.Priority)
			}
			if c.Comment != "" {
				fmt.Fprintf(b, " comment %s ;", quote(c.Comment))
			}
			b.WriteString(" }")
		}
	case op.Set != nil:
		s := op.Set
		kind := "set"
		if s.IsMap() {
			kind = "map"
		}
		fmt.Fprintf(b, "%s %s %s %s", kind, fam, t.Table, s.Name)
		if op.Kind == OpAdd {
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
		fmt.Fprintf(b, "element %s %s %s { ", fam, t.Table, e.Set)
		writeKey(b, e.Key)
		if e.Comment != "" && op.Kind == OpAdd {
			fmt.Fprintf(b, " comment %s", quote(e.Comment))
		}
		if e.Verdict != nil && op.Kind == OpAdd {
			b.WriteString(" : ")
			writeVerdict(b, *e.Verdict)
		}
		b.WriteString(" }")
	case op.Rule != nil:
		r := op.Rule
		fmt.Fprintf(b, "rule %s %s %s", fam, t.Table, r.Chain)
		for _, s := range r.Stmts {
			b.WriteByte(' ')
			writeStmt(b, t.Family, s)
		}
		if r.Comment != "" {
			fmt.Fprintf(b, " comment %s", quote(r.Comment))
		}
	}
}

func quote(s string) string { return strconv.Quote(s) }

func writeKey(b *strings.Builder, key []Value) {
	for i, v := range key {
		if i > 0 {
			b.WriteString(" . ")
		}
		b.WriteString(v.String())
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
		return strings.ToLower(string(v.Proto))
	default:
		return strconv.Itoa(int(v.Port))
	}
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
			b.WriteString("@" + s.Set)
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
		b.WriteString("meta l4proto " + strings.ToLower(string(s.Proto)))
	case MatchDport:
		fmt.Fprintf(b, "%s dport %d", strings.ToLower(string(s.Proto)), s.Port)
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
		fmt.Fprintf(b, "meta l4proto %s dnat to %s", strings.ToLower(string(s.Proto)), s.To.String())
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
		fmt.Fprintf(b, "numgen random mod %d %d", s.Mod, s.Value)
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
