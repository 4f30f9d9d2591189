// Package nft is kproxy's narrow view of nftables: a small typed model of
// the objects and rule statements kproxy uses, a transaction of operations
// on them, its `nft -f` text form (what `kproxy render` prints) and the
// one reader of nft text (Read, Parse: that form, the nested form `nft
// list` prints and the kernel's listing variants), which the tracer and
// nfttest.Fake both use. Sending a transaction to the kernel is the
// subpackage nfnetlink's job (netlink, one batch = one atomic
// transaction); Exec sends the text form through the nft binary and is
// the tests' oracle for it; nfttest holds a stateful fake.
//
// Only the statement shapes the nftables proxier needs exist here; that
// keeps lowering to netlink expressions small and checkable. Sample lists
// them all.
package nft

import (
	"net/netip"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
)

// Family is an nftables address family.
type Family string

// Families kproxy uses.
const (
	IPv4 Family = "ip"
	IPv6 Family = "ip6"
)

// FamilyFor maps a Kubernetes IP family to the nftables table family.
func FamilyFor(f v1.IPFamily) Family {
	if f == v1.IPv6Protocol {
		return IPv6
	}
	return IPv4
}

// Table is an nftables table.
type Table struct {
	Family  Family
	Name    string
	Comment string
}

// Base chain types and hooks.
const (
	TypeFilter = "filter"
	TypeNAT    = "nat"

	HookPrerouting  = "prerouting"
	HookInput       = "input"
	HookForward     = "forward"
	HookOutput      = "output"
	HookPostrouting = "postrouting"
)

// Standard priorities (see nft(8), "PRIORITY").
const (
	PriorityFilter = 0
	PriorityDstNAT = -100
	PrioritySrcNAT = 100
)

// Chain is a regular chain (Hook == "") or a base chain.
type Chain struct {
	Name     string
	Type     string // base chains only
	Hook     string // base chains only
	Priority int    // base chains only
	Comment  string
}

// DataType is an nftables set key or data type.
type DataType string

// Data types kproxy uses.
const (
	TypeIPv4Addr    DataType = "ipv4_addr"
	TypeIPv6Addr    DataType = "ipv6_addr"
	TypeInetProto   DataType = "inet_proto"
	TypeInetService DataType = "inet_service"
	TypeVerdict     DataType = "verdict"
)

// AddrType returns the address data type of a table family.
func AddrType(f Family) DataType {
	if f == IPv6 {
		return TypeIPv6Addr
	}
	return TypeIPv4Addr
}

// Set is a named set (Data == "") or map.
type Set struct {
	Name string
	// Key is the key type; more than one entry is a concatenation.
	Key []DataType
	// Data is the value type of a map (TypeVerdict for a verdict map).
	Data DataType
	// Interval allows prefixes as keys (flags interval).
	Interval bool
	// Dynamic sets are updated from the packet path (flags dynamic,timeout).
	Dynamic bool
	Timeout time.Duration
	Comment string
	// Endpoints, when set, makes the set an endpoint map of that
	// protocol, "typeof numgen random mod 1 : ip daddr . tcp dport" (ip6
	// daddr in ip6 tables; udp, sctp), and Key and Data must be empty:
	// integer keys (the values DNATMap's numgen draws) mapped to an
	// address and port. nft 1.0.6 refuses to bind numgen's integer to a
	// map declared by "type" (mark is a different type, integer has no
	// size), so it needs typeof and the user data nft writes for it. The
	// protocol is part of the type because nft 1.0.6, reading a map
	// declared with "th dport" back from the kernel, refuses every later
	// rule using it ("conflicting protocols specified: tcp vs. th"); a
	// map typed "tcp dport" works with "meta l4proto tcp" rules.
	Endpoints v1.Protocol
	// ByService, with Endpoints, keys the endpoint map by service too:
	// "typeof ip daddr . tcp dport . numgen random mod 1 : ip daddr .
	// tcp dport", elements SERVICE-IP . PORT . INDEX : ADDR . PORT (see
	// DNATByService). One such map serves every service of a protocol,
	// so that the rule picking among a service's endpoints needs nothing
	// of the service but its endpoint count: services with equal counts
	// share one chain. (typeof again: nft refuses "type ipv4_addr .
	// inet_service . mark" for numgen's integer.)
	ByService bool
}

// IsMap reports whether the set is a map.
func (s *Set) IsMap() bool { return s.Data != "" || s.Endpoints != "" }

// Value is one component of a set element key: an address, a prefix, a
// protocol or a port. Exactly one field is set.
type Value struct {
	Addr   netip.Addr
	Prefix netip.Prefix
	Proto  v1.Protocol
	Port   uint16
}

// Element is one set or map element.
type Element struct {
	Set string
	Key []Value
	// Verdict is the value of a verdict map element.
	Verdict *Verdict
	Comment string
	// To, when valid, makes this an element of an endpoint map (see
	// Set.Endpoints): Index : To.Addr . To.Port, and Key is empty; in a
	// map keyed by service (Set.ByService) Key is the service's address
	// and port: Key[0] . Key[1] . Index : To.Addr . To.Port.
	// Deletions carry To as well; nft accepts the data in "delete
	// element" and it keeps the text form unambiguous.
	Index uint32
	To    netip.AddrPort
}

// IsEndpoint reports whether e is an endpoint map element.
func (e *Element) IsEndpoint() bool { return e.To.IsValid() }

// VerdictKind is what a verdict does.
type VerdictKind string

// Verdict kinds.
const (
	Accept VerdictKind = "accept"
	Drop   VerdictKind = "drop"
	Return VerdictKind = "return"
	Jump   VerdictKind = "jump"
	Goto   VerdictKind = "goto"
	// Reject is not a verdict in the kernel but a statement; in maps it
	// is expressed as "goto reject-chain".
)

// Verdict ends (or diverts) rule evaluation.
type Verdict struct {
	Kind  VerdictKind
	Chain string // for Jump and Goto
}

// Rule is a list of statements: matches first, then actions, optionally a
// verdict. All matches must hold for the actions to run.
type Rule struct {
	Chain   string
	Stmts   []Stmt
	Comment string
}

// Stmt is one statement of a rule. The concrete types below are all there is.
type Stmt interface{ stmt() }

// Field is a packet field usable in a concatenated map lookup.
type Field string

// Fields kproxy looks up.
const (
	FieldDaddr   Field = "daddr"   // ip/ip6 daddr
	FieldSaddr   Field = "saddr"   // ip/ip6 saddr
	FieldL4Proto Field = "l4proto" // meta l4proto
	FieldDport   Field = "dport"   // th dport
)

// MatchCtStateNew matches "ct state new".
type MatchCtStateNew struct{}

// MatchAddr matches "ip saddr|daddr [!=] ADDR|PREFIX|{...}|@set".
type MatchAddr struct {
	Source   bool // saddr instead of daddr
	Negate   bool
	Prefixes []netip.Prefix // one address is a full-length prefix
	Set      string         // a named set instead of Prefixes
}

// MatchL4Proto matches "meta l4proto tcp|udp|sctp".
type MatchL4Proto struct{ Proto v1.Protocol }

// MatchDport matches "tcp|udp|sctp dport N" (which implies the protocol).
type MatchDport struct {
	Proto v1.Protocol
	Port  uint16
}

// MatchFibLocal matches "fib saddr|daddr type local".
type MatchFibLocal struct{ Source bool }

// MatchIifname matches "iifname [!=] NAME" ("NAME*" when Prefix).
type MatchIifname struct {
	Negate bool
	Name   string
	Prefix bool
}

// MatchMarkZero matches "meta mark & MASK == 0".
type MatchMarkZero struct{ Mask uint32 }

// SetMarkOr is "meta mark set meta mark | MASK".
type SetMarkOr struct{ Mask uint32 }

// SetMarkXor is "meta mark set meta mark ^ MASK".
type SetMarkXor struct{ Mask uint32 }

// Masquerade is "masquerade fully-random".
type Masquerade struct{}

// DNAT is "meta l4proto PROTO dnat to ADDR:PORT".
type DNAT struct {
	Proto v1.Protocol
	To    netip.AddrPort
}

// DNATMap is "meta l4proto PROTO dnat ip to numgen random mod MOD offset
// OFFSET map @MAP" (dnat ip6 in ip6 tables): the destination is the
// element OFFSET+r of an endpoint map (Set.Endpoints), r uniform in
// [0, MOD). One rule per service picks among its MOD endpoints, which
// own the keys OFFSET ... OFFSET+MOD-1 of a map shared by a group of
// services: 5 expressions instead of ~7 per endpoint, which is what the
// kernel spends a full sync's time on (parsing each expression).
type DNATMap struct {
	Proto       v1.Protocol
	Mod, Offset uint32
	Map         string
}

// DNATByService is "meta l4proto PROTO dnat ip to ip daddr . th dport .
// numgen random mod MOD map @MAP" (ip6 daddr, dnat ip6 in ip6 tables):
// the destination is the element DADDR . DPORT . r of an endpoint map
// keyed by service (Set.ByService), r uniform in [0, MOD). The rule names
// nothing of a service but its endpoint count, so one chain per count
// serves every service with that count, and an endpoint change is only
// element operations: the kernel's commit walks every chain of the
// netns, so the number of chains is what a small transaction costs.
type DNATByService struct {
	Proto v1.Protocol
	Mod   uint32
	Map   string
}

// UpdateSaddr is "update @SET { ip saddr }": adds or refreshes the packet's
// source address in a dynamic set (session affinity).
type UpdateSaddr struct{ Set string }

// VmapLookup is "FIELD . FIELD ... vmap @MAP".
type VmapLookup struct {
	Fields []Field
	Map    string
}

// NumgenVmap is "numgen random mod N vmap { 0 : goto C0, 1 : goto C1, ... }".
type NumgenVmap struct{ Chains []string }

// MatchInSet matches "FIELD . FIELD ... @SET": the concatenation of the
// packet's fields is an element of a named set. kproxy uses
// "ip saddr . ip daddr @hairpin" in postrouting: a packet DNATed back to
// the pod that sent it has equal source and destination, and nft cannot
// compare two fields directly.
type MatchInSet struct {
	Fields []Field
	Set    string
}

// MatchNumgen is "numgen random mod MOD VALUE": true for a uniformly random
// 1/MOD of packets, drawn afresh by each rule. A chain of such rules with
// MOD = N, N-1, ..., 2 and a last unconditional rule picks each of N
// targets with probability 1/N, as iptables' statistic rules do.
//
// kproxy uses it instead of NumgenVmap for endpoint choice: every inline
// vmap is an anonymous set, and the kernel's loop check walks every set
// of the table for each jump it validates, so thousands of anonymous sets
// make a full sync quadratic (measured: 5000 services took 10.7 s, 10x
// more than the same rules without anonymous sets).
type MatchNumgen struct{ Mod, Value uint32 }

// Reject is "reject": ICMP (or ICMPv6) port unreachable for every protocol,
// TCP included, as upstream's reject-chain does.
type Reject struct{}

// Counter is "counter".
type Counter struct{}

// Verdict is also a statement (last in a rule).
func (Verdict) stmt() {}

// Referrer is a statement that names chains (jump, goto) or sets and maps
// of its table: the kernel refuses a rule naming what does not exist and
// the deletion of what a rule still names, and a walk of the chains
// reachable from a base chain follows the chains and the verdict maps.
// A statement type that names anything implements it; nfttest.Fake and
// the tracer ask it (Refs), never a type switch of their own.
type Referrer interface {
	Stmt
	// Refs appends the chains and the sets (maps too) the statement names.
	Refs(chains, sets []string) ([]string, []string)
}

// Refs returns the chains and sets the statements name, in order.
func Refs(stmts []Stmt) (chains, sets []string) {
	for _, s := range stmts {
		if r, ok := s.(Referrer); ok {
			chains, sets = r.Refs(chains, sets)
		}
	}
	return chains, sets
}

// Refs: jump and goto name a chain.
func (v Verdict) Refs(chains, sets []string) ([]string, []string) {
	if v.Kind == Jump || v.Kind == Goto {
		chains = append(chains, v.Chain)
	}
	return chains, sets
}

// Refs: every branch names a chain.
func (s NumgenVmap) Refs(chains, sets []string) ([]string, []string) {
	return append(chains, s.Chains...), sets
}

// Refs: the verdict map.
func (s VmapLookup) Refs(chains, sets []string) ([]string, []string) {
	return chains, append(sets, s.Map)
}

// Refs: the set.
func (s MatchInSet) Refs(chains, sets []string) ([]string, []string) {
	return chains, append(sets, s.Set)
}

// Refs: the set, when the match is on one.
func (s MatchAddr) Refs(chains, sets []string) ([]string, []string) {
	if s.Set != "" {
		sets = append(sets, s.Set)
	}
	return chains, sets
}

// Refs: the dynamic set.
func (s UpdateSaddr) Refs(chains, sets []string) ([]string, []string) {
	return chains, append(sets, s.Set)
}

// Refs: the endpoint map.
func (s DNATMap) Refs(chains, sets []string) ([]string, []string) {
	return chains, append(sets, s.Map)
}

// Refs: the endpoint map.
func (s DNATByService) Refs(chains, sets []string) ([]string, []string) {
	return chains, append(sets, s.Map)
}

func (MatchCtStateNew) stmt() {}
func (MatchAddr) stmt()       {}
func (MatchL4Proto) stmt()    {}
func (MatchDport) stmt()      {}
func (MatchFibLocal) stmt()   {}
func (MatchIifname) stmt()    {}
func (MatchMarkZero) stmt()   {}
func (SetMarkOr) stmt()       {}
func (SetMarkXor) stmt()      {}
func (Masquerade) stmt()      {}
func (DNAT) stmt()            {}
func (DNATMap) stmt()         {}
func (DNATByService) stmt()   {}
func (UpdateSaddr) stmt()     {}
func (VmapLookup) stmt()      {}
func (NumgenVmap) stmt()      {}
func (MatchNumgen) stmt()     {}
func (MatchInSet) stmt()      {}
func (Reject) stmt()          {}
func (Counter) stmt()         {}

// OpKind is the kind of a transaction operation.
type OpKind string

// Operations. Add is idempotent (creates if missing), Create fails if it
// exists, Flush empties a chain or set, Delete removes.
const (
	OpAdd OpKind = "add"
	// OpInsert puts a rule at the head of its chain ("insert rule").
	OpInsert OpKind = "insert"
	OpFlush  OpKind = "flush"
	OpDelete OpKind = "delete"
)

// Op is one operation on one object. Exactly one of the object pointers is set.
type Op struct {
	Kind OpKind
	// In is the table the operation is on when it is not the
	// transaction's own table (Transaction.Table); "" means that one.
	// Objects never name their table: a rule can only reference chains
	// and sets of its own table.
	In      string
	Table   *Table
	Chain   *Chain
	Set     *Set
	Element *Element
	Rule    *Rule
}

// Comment is the comment of the operation's object, "" if it has none.
func (op *Op) Comment() string {
	switch {
	case op.Table != nil:
		return op.Table.Comment
	case op.Chain != nil:
		return op.Chain.Comment
	case op.Set != nil:
		return op.Set.Comment
	case op.Element != nil:
		return op.Element.Comment
	case op.Rule != nil:
		return op.Rule.Comment
	}
	return ""
}

// Transaction is an ordered list of operations on the tables of one
// family, applied atomically: all or nothing, as one nf_tables kernel
// transaction (one netlink batch; one `nft -f` run). Most operations are
// on Table; those with Op.In set are on other tables (see In).
type Transaction struct {
	Family Family
	Table  string
	Ops    []Op
}

// NewTransaction starts a transaction on one table (more with In).
func NewTransaction(f Family, table string) *Transaction {
	return &Transaction{Family: f, Table: table}
}

// TableOf is the table an operation of t is on.
func (t *Transaction) TableOf(op *Op) string {
	if op.In != "" {
		return op.In
	}
	return t.Table
}

// Tables lists the tables the transaction touches, t.Table first (when
// any operation is on it), then in order of first use.
func (t *Transaction) Tables() []string {
	var out []string
	own := false
	for i := range t.Ops {
		in := t.Ops[i].In
		if in == "" || in == t.Table {
			own = true
			continue
		}
		if !slices.Contains(out, in) {
			out = append(out, in)
		}
	}
	if own {
		out = append([]string{t.Table}, out...)
	}
	return out
}

// TableOps appends operations on one table to a transaction: the same
// methods as Transaction, which is TableOps of its own table.
type TableOps struct {
	tx *Transaction
	in string
}

// In returns a writer of operations on another table of the same family,
// in the same kernel transaction. In(t.Table) writes to t's own table.
func (t *Transaction) In(table string) TableOps {
	if table == t.Table {
		table = ""
	}
	return TableOps{tx: t, in: table}
}

// Name is the table the writer writes to.
func (w TableOps) Name() string {
	if w.in == "" {
		return w.tx.Table
	}
	return w.in
}

// Add appends "add" operations for each object given.
func (w TableOps) Add(objs ...any) { w.op(OpAdd, objs) }

// AddRules appends "add rule" operations; the same as Add(rules...)
// without boxing every rule into a []any first.
func (w TableOps) AddRules(rules ...*Rule) {
	for _, r := range rules {
		w.tx.Ops = append(w.tx.Ops, Op{Kind: OpAdd, In: w.in, Rule: r})
	}
}

// AddElements appends "add element" operations.
func (w TableOps) AddElements(elems ...*Element) {
	w.tx.Ops = slices.Grow(w.tx.Ops, len(elems))
	for _, e := range elems {
		w.tx.Ops = append(w.tx.Ops, Op{Kind: OpAdd, In: w.in, Element: e})
	}
}

// Insert appends "insert rule" operations: each rule goes to the head of
// its chain, so rules inserted one after another end up in reverse order.
func (w TableOps) Insert(rules ...*Rule) {
	for _, r := range rules {
		w.tx.Ops = append(w.tx.Ops, Op{Kind: OpInsert, In: w.in, Rule: r})
	}
}

// Flush appends "flush" operations (chains, sets, the table).
func (w TableOps) Flush(objs ...any) { w.op(OpFlush, objs) }

// Delete appends "delete" operations.
func (w TableOps) Delete(objs ...any) { w.op(OpDelete, objs) }

func (w TableOps) op(k OpKind, objs []any) {
	for _, o := range objs {
		op := Op{Kind: k, In: w.in}
		switch v := o.(type) {
		case *Table:
			op.Table = v
		case *Chain:
			op.Chain = v
		case *Set:
			op.Set = v
		case *Element:
			op.Element = v
		case *Rule:
			op.Rule = v
		default:
			panic("nft: unknown object type in transaction")
		}
		w.tx.Ops = append(w.tx.Ops, op)
	}
}

// Add appends "add" operations on t.Table for each object given.
func (t *Transaction) Add(objs ...any) { t.In("").op(OpAdd, objs) }

// Insert appends "insert rule" operations on t.Table (see TableOps.Insert).
func (t *Transaction) Insert(rules ...*Rule) { t.In("").Insert(rules...) }

// Flush appends "flush" operations on t.Table (chains, sets, the table).
func (t *Transaction) Flush(objs ...any) { t.In("").op(OpFlush, objs) }

// Delete appends "delete" operations on t.Table.
func (t *Transaction) Delete(objs ...any) { t.In("").op(OpDelete, objs) }

// Len is the number of operations.
func (t *Transaction) Len() int { return len(t.Ops) }
