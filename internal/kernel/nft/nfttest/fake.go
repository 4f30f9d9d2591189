// Package nfttest provides a stateful fake of nft.Interface for tests:
// it keeps tables, chains, sets, elements and rules in memory, rejects
// what the kernel rejects (with the kernel's errno), applies each
// transaction atomically and dumps its state as `nft -f` text.
package nfttest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/nft/nfnetlink"
)

// Fake is an in-memory nf_tables. The zero value is not usable; use New.
type Fake struct {
	mu      sync.Mutex
	tables  map[tableKey]*table
	applies []ApplyRecord

	// BeforeApply, when set, is called at the start of every Apply; an
	// error fails the Apply (recorded, state unchanged). Tests use it to
	// simulate kernel failures.
	BeforeApply func(tx *nft.Transaction) error
	// Checks counts the calls of Check (BeforeApply is called for them
	// too).
	Checks int
}

var (
	_ nft.Interface = (*Fake)(nil)
	_ nft.Checker   = (*Fake)(nil)
)

// ApplyRecord is one call of Apply.
type ApplyRecord struct {
	Family nft.Family
	Table  string
	// Ops is the number of operations of the transaction (0 for an empty
	// transaction, which is recorded too).
	Ops int
	Err error
	// Tx is the caller's transaction (not a copy).
	Tx *nft.Transaction
}

// New returns an empty fake.
func New() *Fake { return &Fake{tables: map[tableKey]*table{}} }

type tableKey struct {
	family nft.Family
	name   string
}

type table struct {
	comment string
	chains  map[string]*chain
	sets    map[string]*set
}

type chain struct {
	def   nft.Chain
	rules []*ruleEntry
}

type ruleEntry struct {
	rule nft.Rule
	op   int // index of the op that added it in the current Apply, else -1
}

type set struct {
	def   nft.Set
	elems map[string]*elemEntry
}

type elemEntry struct {
	elem nft.Element
	lo   netip.Addr // interval sets: the range the element covers
	hi   netip.Addr
}

func (t *table) clone() *table {
	c := &table{comment: t.comment, chains: make(map[string]*chain, len(t.chains)), sets: make(map[string]*set, len(t.sets))}
	for n, ch := range t.chains {
		rules := make([]*ruleEntry, len(ch.rules))
		for i, r := range ch.rules {
			rules[i] = &ruleEntry{rule: r.rule, op: -1}
		}
		c.chains[n] = &chain{def: ch.def, rules: rules}
	}
	for n, s := range t.sets {
		elems := make(map[string]*elemEntry, len(s.elems))
		for k, e := range s.elems {
			elems[k] = e // entries are never modified in place
		}
		c.sets[n] = &set{def: s.def, elems: elems}
	}
	return c
}

// Applies returns the Apply calls so far.
func (f *Fake) Applies() []ApplyRecord {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.applies)
}

// ResetApplies forgets the recorded Apply calls.
func (f *Fake) ResetApplies() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applies = nil
}

// OpsApplied is the number of operations of all successful Apply calls
// recorded so far: 0 means no kernel work was done.
func (f *Fake) OpsApplied() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, a := range f.applies {
		if a.Err == nil {
			n += a.Ops
		}
	}
	return n
}

// Apply applies the transaction atomically, or returns the error the
// kernel would and leaves the state unchanged.
func (f *Fake) Apply(ctx context.Context, tx *nft.Transaction) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	err := f.apply(tx)
	f.applies = append(f.applies, ApplyRecord{Family: tx.Family, Table: tx.Table, Ops: tx.Len(), Err: err, Tx: tx})
	if err != nil {
		return fmt.Errorf("nft: transaction of %d operations on %s not applied: %w", tx.Len(), tx.Where(), err)
	}
	return nil
}

// Check implements nft.Checker: the transaction is run against a copy of
// the state (Apply's checks and validation) and dropped. It is recorded
// in Checks, not in the applies.
func (f *Fake) Check(ctx context.Context, tx *nft.Transaction) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Checks++
	saved := f.tables
	f.tables = maps.Clone(saved) // apply copies a table before changing it
	err := f.apply(tx)
	f.tables = saved
	if err != nil {
		return fmt.Errorf("nft: check of a transaction of %d operations on %s: %w", tx.Len(), tx.Where(), err)
	}
	return nil
}

func (f *Fake) apply(tx *nft.Transaction) error {
	if f.BeforeApply != nil {
		if err := f.BeforeApply(tx); err != nil {
			return err
		}
	}
	if tx.Len() == 0 {
		return nil
	}
	if tx.Family != nft.IPv4 && tx.Family != nft.IPv6 {
		return &nft.OpError{Index: -1, Err: unix.EAFNOSUPPORT, Message: fmt.Sprintf("unsupported family %q", tx.Family)}
	}
	a := &applier{f: f, tx: tx, work: map[string]*table{}}
	for i := range tx.Ops {
		if err := a.op(i); err != nil {
			var oe *nft.OpError
			if errors.As(err, &oe) {
				return err
			}
			return &nft.OpError{Index: i, Op: tx.OpText(i), Err: err}
		}
	}
	// The kernel validates every table the transaction touched, then
	// commits all of them at once.
	names := slices.Sorted(maps.Keys(a.work))
	for _, name := range names {
		if a.t = a.work[name]; a.t != nil {
			if err := a.validate(); err != nil {
				return err
			}
		}
	}
	for _, name := range names {
		key := tableKey{tx.Family, name}
		if t := a.work[name]; t != nil {
			f.tables[key] = t
		} else {
			delete(f.tables, key)
		}
	}
	return nil
}

// applier applies the operations of one transaction to copies of the
// tables it touches.
type applier struct {
	f  *Fake
	tx *nft.Transaction
	// work holds the copy of each table touched so far (nil: it does not
	// exist, or no longer).
	work map[string]*table
	cur  string
	t    *table // work[cur]
}

// use makes the table of an operation current, copying it on first use.
func (a *applier) use(name string) {
	if a.cur == name && a.t != nil {
		return
	}
	a.cur = name
	t, ok := a.work[name]
	if !ok {
		if old, exists := a.f.tables[tableKey{a.tx.Family, name}]; exists {
			t = old.clone()
		}
		a.work[name] = t
	}
	a.t = t
}

// kerr is an error with the kernel's errno and nft's wording.
func kerr(errno unix.Errno, format string, args ...any) error {
	return &nft.OpError{Index: -2, Message: fmt.Sprintf(format, args...), Err: errno}
}

func (a *applier) op(i int) error {
	op := &a.tx.Ops[i]
	a.use(a.tx.TableOf(op))
	err := a.do(i, op)
	a.work[a.cur] = a.t // table operations create or delete it
	if err == nil {
		return nil
	}
	var oe *nft.OpError
	if errors.As(err, &oe) && oe.Index == -2 {
		oe.Index, oe.Op = i, a.tx.OpText(i)
	}
	return err
}

func (a *applier) do(i int, op *nft.Op) error {
	if op.Table != nil {
		return a.tableOp(op)
	}
	if a.t == nil {
		return kerr(unix.ENOENT, "table %s %s does not exist", a.tx.Family, a.cur)
	}
	switch {
	case op.Chain != nil:
		return a.chainOp(op.Kind, op.Chain)
	case op.Set != nil:
		return a.setOp(op.Kind, op.Set)
	case op.Element != nil:
		return a.elementOp(op.Kind, op.Element)
	case op.Rule != nil:
		return a.ruleOp(i, op.Kind, op.Rule)
	}
	return kerr(unix.EINVAL, "operation without an object")
}

func (a *applier) tableOp(op *nft.Op) error {
	switch op.Kind {
	case nft.OpAdd:
		if err := nft.CheckComment(op.Table.Comment); err != nil {
			return err
		}
		// Re-adding a table keeps its comment, as the kernel does.
		if a.t == nil {
			a.t = &table{comment: op.Table.Comment, chains: map[string]*chain{}, sets: map[string]*set{}}
		}
	case nft.OpFlush:
		if a.t == nil {
			return kerr(unix.ENOENT, "table does not exist")
		}
		// "flush table" removes every rule; sets keep their elements.
		for _, c := range a.t.chains {
			c.rules = nil
		}
	case nft.OpDelete:
		if a.t == nil {
			return kerr(unix.ENOENT, "table does not exist")
		}
		a.t = nil
	default:
		return kerr(unix.EINVAL, "unknown operation %q", op.Kind)
	}
	return nil
}

var hooks = map[string]bool{nft.HookPrerouting: true, nft.HookInput: true, nft.HookForward: true, nft.HookOutput: true, nft.HookPostrouting: true}

func (a *applier) chainOp(kind nft.OpKind, c *nft.Chain) error {
	if c.Name == "" {
		return kerr(unix.EINVAL, "chain without a name")
	}
	old := a.t.chains[c.Name]
	switch kind {
	case nft.OpAdd:
		if err := nft.CheckComment(c.Comment); err != nil {
			return err
		}
		if c.Hook != "" {
			if !hooks[c.Hook] {
				return kerr(unix.EOPNOTSUPP, "unknown hook %q", c.Hook)
			}
			if c.Type != nft.TypeFilter && c.Type != nft.TypeNAT {
				return kerr(unix.ENOENT, "unknown chain type %q", c.Type)
			}
			if c.Type == nft.TypeNAT && c.Hook == nft.HookForward {
				return kerr(unix.EOPNOTSUPP, "nat chains cannot hook forward")
			}
		}
		if old == nil {
			a.t.chains[c.Name] = &chain{def: *c}
			return nil
		}
		switch {
		case c.Hook == "":
			// Adding a chain that exists is a no-op, also for a base chain.
		case old.def.Hook == "":
			return kerr(unix.EEXIST, "chain %s exists and is not a base chain", c.Name)
		case old.def.Hook != c.Hook || old.def.Type != c.Type || old.def.Priority != c.Priority:
			return kerr(unix.EOPNOTSUPP, "base chain %s exists with a different type, hook or priority", c.Name)
		}
	case nft.OpFlush:
		if old == nil {
			return kerr(unix.ENOENT, "chain %s does not exist", c.Name)
		}
		old.rules = nil
	case nft.OpDelete:
		if old == nil {
			return kerr(unix.ENOENT, "chain %s does not exist", c.Name)
		}
		if len(old.rules) > 0 {
			return kerr(unix.EBUSY, "chain %s still has rules (flush it first)", c.Name)
		}
		if by := a.chainUser(c.Name); by != "" {
			return kerr(unix.EBUSY, "chain %s is still used by %s", c.Name, by)
		}
		delete(a.t.chains, c.Name)
	default:
		return kerr(unix.EINVAL, "unknown operation %q", kind)
	}
	return nil
}

// chainUser names something that jumps to the chain, or "".
func (a *applier) chainUser(name string) string {
	for cn, c := range a.t.chains {
		for _, r := range c.rules {
			for _, t := range ruleTargets(r.rule) {
				if t == name {
					return "a rule in chain " + cn
				}
			}
		}
	}
	for sn, s := range a.t.sets {
		for _, e := range s.elems {
			if v := e.elem.Verdict; v != nil && (v.Kind == nft.Jump || v.Kind == nft.Goto) && v.Chain == name {
				return "an element of map " + sn
			}
		}
	}
	return ""
}

// ruleTargets lists the chains a rule jumps or goes to.
func ruleTargets(r nft.Rule) []string {
	var out []string
	for _, s := range r.Stmts {
		switch s := s.(type) {
		case nft.Verdict:
			if s.Kind == nft.Jump || s.Kind == nft.Goto {
				out = append(out, s.Chain)
			}
		case nft.NumgenVmap:
			out = append(out, s.Chains...)
		}
	}
	return out
}

// ruleSets lists the named sets a rule uses.
func ruleSets(r nft.Rule) []string {
	var out []string
	for _, s := range r.Stmts {
		switch s := s.(type) {
		case nft.MatchAddr:
			if s.Set != "" {
				out = append(out, s.Set)
			}
		case nft.UpdateSaddr:
			out = append(out, s.Set)
		case nft.VmapLookup:
			out = append(out, s.Map)
		case nft.MatchInSet:
			out = append(out, s.Set)
		case nft.DNATMap:
			out = append(out, s.Map)
		case nft.DNATByService:
			out = append(out, s.Map)
		}
	}
	return out
}

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

func (a *applier) setOp(kind nft.OpKind, s *nft.Set) error {
	if s.Name == "" {
		return kerr(unix.EINVAL, "set without a name")
	}
	old := a.t.sets[s.Name]
	switch kind {
	case nft.OpAdd:
		if err := nft.CheckComment(s.Comment); err != nil {
			return err
		}
		if s.Endpoints != "" {
			if len(s.Key) > 0 || s.Data != "" || s.Interval || s.Dynamic || s.Timeout > 0 {
				return kerr(unix.EINVAL, "endpoint map %s: no key, data type, flags or timeout of its own", s.Name)
			}
			if s.Comment != "" {
				return kerr(unix.EOPNOTSUPP, "endpoint map %s: comments are not supported", s.Name)
			}
			if old == nil {
				a.t.sets[s.Name] = &set{def: *s, elems: map[string]*elemEntry{}}
			} else if !sameSetFlags(&old.def, s) {
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
		if s.Interval && len(s.Key) > 1 {
			return kerr(unix.EOPNOTSUPP, "set %s: interval sets with concatenated keys are not supported", s.Name)
		}
		if s.Interval && s.Key[0] != nft.TypeIPv4Addr && s.Key[0] != nft.TypeIPv6Addr {
			return kerr(unix.EOPNOTSUPP, "set %s: only address interval sets are supported", s.Name)
		}
		if old == nil {
			a.t.sets[s.Name] = &set{def: *s, elems: map[string]*elemEntry{}}
			return nil
		}
		// The kernel refuses to redefine a set but updates its timeout;
		// the comment of the existing one stays.
		if !sameSetFlags(&old.def, s) {
			return kerr(unix.EEXIST, "set %s exists with a different definition", s.Name)
		}
		if s.Timeout > 0 {
			old.def.Timeout = s.Timeout
		}
	case nft.OpFlush:
		if old == nil {
			return kerr(unix.ENOENT, "set %s does not exist", s.Name)
		}
		// nft looks up "flush set" among sets and "flush map" among maps.
		if old.def.IsMap() != s.IsMap() {
			return kerr(unix.ENOENT, "%s is a %s; flush it as one", s.Name, kindName(&old.def))
		}
		old.elems = map[string]*elemEntry{}
	case nft.OpDelete:
		if old == nil {
			return kerr(unix.ENOENT, "set %s does not exist", s.Name)
		}
		for cn, c := range a.t.chains {
			for _, r := range c.rules {
				if slices.Contains(ruleSets(r.rule), s.Name) {
					return kerr(unix.EBUSY, "set %s is still used by a rule in chain %s", s.Name, cn)
				}
			}
		}
		delete(a.t.sets, s.Name)
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

func (a *applier) checkJump(v nft.Verdict) error {
	switch v.Kind {
	case nft.Accept, nft.Drop, nft.Return:
		return nil
	case nft.Jump, nft.Goto:
		c := a.t.chains[v.Chain]
		if c == nil {
			return kerr(unix.ENOENT, "%s to chain %q, which does not exist", v.Kind, v.Chain)
		}
		if c.def.Hook != "" {
			return kerr(unix.EOPNOTSUPP, "%s to base chain %s", v.Kind, v.Chain)
		}
		return nil
	}
	return kerr(unix.EINVAL, "unknown verdict %q", v.Kind)
}

func (a *applier) elementOp(kind nft.OpKind, e *nft.Element) error {
	s := a.t.sets[e.Set]
	if s == nil {
		return kerr(unix.ENOENT, "set %s does not exist", e.Set)
	}
	if kind == nft.OpFlush {
		return kerr(unix.EINVAL, "elements cannot be flushed")
	}
	if s.def.Endpoints != "" || e.IsEndpoint() {
		return a.endpointElementOp(kind, s, e)
	}
	if len(e.Key) != len(s.def.Key) {
		return kerr(unix.EINVAL, "key has %d components, set %s has %d", len(e.Key), e.Set, len(s.def.Key))
	}
	for i, t := range s.def.Key {
		if err := checkValue(t, e.Key[i], s.def.Interval); err != nil {
			return err
		}
	}
	k := elemKey(e.Key)
	var lo, hi netip.Addr
	if s.def.Interval {
		lo, hi = valueRange(e.Key[0])
		k = lo.String() + "-" + hi.String()
	}
	old := s.elems[k]
	switch kind {
	case nft.OpAdd:
		if err := nft.CheckComment(e.Comment); err != nil {
			return err
		}
		if s.def.IsMap() {
			if e.Verdict == nil {
				return kerr(unix.EINVAL, "map element without a verdict")
			}
			if err := a.checkJump(*e.Verdict); err != nil {
				return err
			}
		} else if e.Verdict != nil {
			return kerr(unix.EINVAL, "set element with a verdict")
		}
		if old != nil {
			// Adding an element that exists is fine if it maps to the
			// same verdict (its comment stays); else the kernel says
			// EEXIST.
			if !sameVerdict(old.elem.Verdict, e.Verdict) {
				return kerr(unix.EEXIST, "element %s exists with a different verdict", elemKey(e.Key))
			}
			return nil
		}
		if s.def.Interval {
			for _, o := range s.elems {
				if lo.Compare(o.hi) <= 0 && o.lo.Compare(hi) <= 0 {
					return kerr(unix.EEXIST, "interval %s overlaps %s", elemKey(e.Key), elemKey(o.elem.Key))
				}
			}
		}
		ne := *e
		ne.Key = slices.Clone(e.Key)
		for i, v := range ne.Key {
			if v.Prefix.IsValid() {
				ne.Key[i].Prefix = v.Prefix.Masked() // as nft does
			}
		}
		if e.Verdict != nil {
			v := *e.Verdict
			ne.Verdict = &v
		}
		s.elems[k] = &elemEntry{elem: ne, lo: lo, hi: hi}
	case nft.OpDelete:
		if old == nil {
			return kerr(unix.ENOENT, "element %s does not exist", elemKey(e.Key))
		}
		delete(s.elems, k)
	default:
		return kerr(unix.EINVAL, "unknown operation %q", kind)
	}
	return nil
}

// endpointElementOp adds or deletes "INDEX : ADDR . PORT" in an endpoint
// map, keyed by INDEX.
func (a *applier) endpointElementOp(kind nft.OpKind, s *set, e *nft.Element) error {
	if s.def.Endpoints == "" || !e.IsEndpoint() || e.Verdict != nil || (len(e.Key) > 0) != s.def.ByService {
		if s.def.ByService {
			return kerr(unix.EINVAL, "an endpoint map keyed by service holds exactly the elements ADDR . PORT . INDEX : ADDR . PORT (set %s)", e.Set)
		}
		return kerr(unix.EINVAL, "an endpoint map holds exactly the elements INDEX : ADDR . PORT (set %s)", e.Set)
	}
	if err := a.addrFamily(e.To.Addr()); err != nil {
		return err
	}
	k := strconv.FormatUint(uint64(e.Index), 10)
	if s.def.ByService {
		if len(e.Key) != 2 || !e.Key[0].Addr.IsValid() || e.Key[1].Addr.IsValid() || e.Key[1].Prefix.IsValid() || e.Key[1].Proto != "" {
			return kerr(unix.EINVAL, "an endpoint map key is ADDR . PORT . INDEX (set %s)", e.Set)
		}
		if err := a.addrFamily(e.Key[0].Addr); err != nil {
			return err
		}
		k = elemKey(e.Key) + " . " + k
	}
	old := s.elems[k]
	switch kind {
	case nft.OpAdd:
		if err := nft.CheckComment(e.Comment); err != nil {
			return err
		}
		if old != nil {
			if old.elem.To != e.To {
				return kerr(unix.EEXIST, "element %s exists with different data", k)
			}
			return nil
		}
		s.elems[k] = &elemEntry{elem: *e}
	case nft.OpDelete:
		if old == nil {
			return kerr(unix.ENOENT, "element %s does not exist", k)
		}
		delete(s.elems, k)
	default:
		return kerr(unix.EINVAL, "unknown operation %q", kind)
	}
	return nil
}

func (a *applier) ruleOp(i int, kind nft.OpKind, r *nft.Rule) error {
	if kind != nft.OpAdd && kind != nft.OpInsert {
		return kerr(unix.EINVAL, "rules can only be added or inserted (flush or delete their chain instead)")
	}
	c := a.t.chains[r.Chain]
	if c == nil {
		return kerr(unix.ENOENT, "chain %s does not exist", r.Chain)
	}
	if err := nft.CheckComment(r.Comment); err != nil {
		return err
	}
	var l4 uint8
	for _, st := range r.Stmts {
		if err := a.checkStmt(st, &l4); err != nil {
			return err
		}
	}
	nr := *r
	nr.Stmts = slices.Clone(r.Stmts)
	e := &ruleEntry{rule: nr, op: i}
	if kind == nft.OpInsert {
		c.rules = append([]*ruleEntry{e}, c.rules...)
	} else {
		c.rules = append(c.rules, e)
	}
	return nil
}

func (a *applier) addrFamily(addr netip.Addr) error {
	if addr.Is4() != (a.tx.Family == nft.IPv4) || addr.Is4In6() {
		return kerr(unix.EINVAL, "address %s does not belong to family %s", addr, a.tx.Family)
	}
	return nil
}

func (a *applier) checkStmt(st nft.Stmt, l4 *uint8) error {
	addrType := nft.AddrType(a.tx.Family)
	switch s := st.(type) {
	case nft.MatchCtStateNew, nft.MatchFibLocal, nft.MatchMarkZero, nft.SetMarkOr, nft.SetMarkXor,
		nft.Masquerade, nft.Reject, nft.Counter:
	case nft.MatchAddr:
		if s.Set != "" {
			set := a.t.sets[s.Set]
			if set == nil {
				return kerr(unix.ENOENT, "set %s does not exist", s.Set)
			}
			// A lookup in a map matches its keys, which the kernel allows.
			if len(set.def.Key) != 1 || set.def.Key[0] != addrType {
				return kerr(unix.EINVAL, "set %s does not have %s keys", s.Set, addrType)
			}
			return nil
		}
		if len(s.Prefixes) == 0 {
			return kerr(unix.EINVAL, "address match without addresses")
		}
		for _, p := range s.Prefixes {
			if !p.IsValid() {
				return kerr(unix.EINVAL, "invalid prefix")
			}
			if err := a.addrFamily(p.Addr()); err != nil {
				return err
			}
		}
	case nft.MatchL4Proto:
		p, ok := nfnetlink.ProtoNumber(s.Proto)
		if !ok {
			return kerr(unix.EINVAL, "unknown protocol %q", s.Proto)
		}
		*l4 = p
	case nft.MatchDport:
		p, ok := nfnetlink.ProtoNumber(s.Proto)
		if !ok {
			return kerr(unix.EINVAL, "unknown protocol %q", s.Proto)
		}
		if *l4 != 0 && *l4 != p {
			return kerr(unix.EINVAL, "conflicting protocols specified")
		}
		*l4 = p
	case nft.MatchIifname:
		if s.Name == "" && s.Prefix {
			return kerr(unix.EINVAL, "all-wildcard strings are not supported")
		}
		if len(s.Name) >= 16 {
			return kerr(unix.EINVAL, "interface name %q is too long", s.Name)
		}
	case nft.DNAT:
		p, ok := nfnetlink.ProtoNumber(s.Proto)
		if !ok {
			return kerr(unix.EINVAL, "unknown protocol %q", s.Proto)
		}
		if !s.To.IsValid() {
			return kerr(unix.EINVAL, "invalid dnat destination")
		}
		if err := a.addrFamily(s.To.Addr()); err != nil {
			return err
		}
		*l4 = p
	case nft.DNATMap:
		p, ok := nfnetlink.ProtoNumber(s.Proto)
		if !ok {
			return kerr(unix.EINVAL, "unknown protocol %q", s.Proto)
		}
		if s.Mod == 0 || s.Offset+s.Mod < s.Offset {
			return kerr(unix.EINVAL, "numgen mod %d offset %d", s.Mod, s.Offset)
		}
		m := a.t.sets[s.Map]
		if m == nil {
			return kerr(unix.ENOENT, "map %s does not exist", s.Map)
		}
		if m.def.ByService {
			// The kernel refuses the lookup: numgen's 4 bytes are not
			// the map's key length.
			return kerr(unix.EINVAL, "%s is an endpoint map keyed by service", s.Map)
		}
		if m.def.Endpoints == "" {
			// The kernel's lookup finds no data of the right kind
			// in a verdict map.
			if m.def.Data == nft.TypeVerdict {
				return kerr(unix.ENODATA, "%s is a verdict map, not an endpoint map", s.Map)
			}
			return kerr(unix.EINVAL, "%s is not an endpoint map", s.Map)
		}
		// nft refuses a rule whose protocol differs from the map's
		// ("conflicting protocols specified").
		if m.def.Endpoints != s.Proto {
			return kerr(unix.EINVAL, "map %s holds %s endpoints, the rule DNATs %s", s.Map, m.def.Endpoints, s.Proto)
		}
		*l4 = p
	case nft.DNATByService:
		p, ok := nfnetlink.ProtoNumber(s.Proto)
		if !ok {
			return kerr(unix.EINVAL, "unknown protocol %q", s.Proto)
		}
		if s.Mod == 0 {
			return kerr(unix.EINVAL, "numgen mod 0")
		}
		m := a.t.sets[s.Map]
		if m == nil {
			return kerr(unix.ENOENT, "map %s does not exist", s.Map)
		}
		// The kernel checks the key length of the concatenation, nft
		// the types and the protocol.
		if m.def.Endpoints == "" || !m.def.ByService {
			return kerr(unix.EINVAL, "%s is not an endpoint map keyed by service", s.Map)
		}
		if m.def.Endpoints != s.Proto {
			return kerr(unix.EINVAL, "map %s holds %s endpoints, the rule DNATs %s", s.Map, m.def.Endpoints, s.Proto)
		}
		*l4 = p
	case nft.UpdateSaddr:
		set := a.t.sets[s.Set]
		if set == nil {
			return kerr(unix.ENOENT, "set %s does not exist", s.Set)
		}
		// The kernel accepts updates of a hash set without the dynamic
		// flag, but interval sets cannot be updated from the packet path.
		if set.def.Interval {
			return kerr(unix.EOPNOTSUPP, "interval set %s cannot be updated from the packet path", s.Set)
		}
		if set.def.IsMap() || len(set.def.Key) != 1 || set.def.Key[0] != addrType {
			return kerr(unix.EINVAL, "set %s is not a set of %s", s.Set, addrType)
		}
	case nft.MatchInSet:
		m := a.t.sets[s.Set]
		if m == nil {
			return kerr(unix.ENOENT, "set %s does not exist", s.Set)
		}
		if m.def.IsMap() {
			return kerr(unix.EINVAL, "%s is a map, not a set", s.Set)
		}
		var want []nft.DataType
		for _, f := range s.Fields {
			switch f {
			case nft.FieldDaddr, nft.FieldSaddr:
				want = append(want, addrType)
			case nft.FieldL4Proto:
				want = append(want, nft.TypeInetProto)
			case nft.FieldDport:
				want = append(want, nft.TypeInetService)
			default:
				return kerr(unix.EINVAL, "unknown field %q", f)
			}
		}
		if !slices.Equal(want, m.def.Key) {
			return kerr(unix.EINVAL, "set %s has key %v, the lookup gives %v", s.Set, m.def.Key, want)
		}
	case nft.VmapLookup:
		m := a.t.sets[s.Map]
		if m == nil {
			return kerr(unix.ENOENT, "map %s does not exist", s.Map)
		}
		if m.def.Data != nft.TypeVerdict {
			return kerr(unix.EINVAL, "%s is not a verdict map", s.Map)
		}
		var want []nft.DataType
		loaded := 0 // bytes the fields put into registers
		for _, f := range s.Fields {
			switch f {
			case nft.FieldDaddr, nft.FieldSaddr:
				want = append(want, addrType)
				loaded += addrLen(addrType)
			case nft.FieldL4Proto:
				want = append(want, nft.TypeInetProto)
				loaded += 4
			case nft.FieldDport:
				want = append(want, nft.TypeInetService)
				loaded += 4
			default:
				return kerr(unix.EINVAL, "unknown field %q", f)
			}
		}
		// The kernel refuses to read registers no expression wrote
		// (ENODATA); it does not check the types, the fake does.
		if loaded < keyLen(m.def.Key) {
			return kerr(unix.ENODATA, "lookup in %s reads %d bytes of registers, only %d were loaded", s.Map, keyLen(m.def.Key), loaded)
		}
		if !slices.Equal(want, m.def.Key) {
			return kerr(unix.EINVAL, "map %s has key %v, the lookup gives %v", s.Map, m.def.Key, want)
		}
	case nft.NumgenVmap:
		if len(s.Chains) == 0 {
			return kerr(unix.EINVAL, "numgen vmap without chains")
		}
		for _, c := range s.Chains {
			if err := a.checkJump(nft.Verdict{Kind: nft.Goto, Chain: c}); err != nil {
				return err
			}
		}
	case nft.MatchNumgen:
		// The kernel takes any modulus; kproxy's lowering refuses a value
		// that can never match, and so does the fake.
		if s.Mod == 0 || s.Value >= s.Mod {
			return kerr(unix.EINVAL, "numgen random mod %d %d can never match", s.Mod, s.Value)
		}
	case nft.Verdict:
		return a.checkJump(s)
	default:
		return kerr(unix.EOPNOTSUPP, "unsupported statement %T", st)
	}
	return nil
}

// NF_JUMP_STACK_SIZE: the kernel refuses deeper chain nesting.
const maxJumpDepth = 16

// Allowed hooks of statements the kernel validates per base chain
// (nft_*_validate in the kernel).
var stmtHooks = map[string]map[string]bool{
	"masquerade": {nft.HookPostrouting: true},
	"dnat":       {nft.HookPrerouting: true, nft.HookOutput: true},
	"reject":     {nft.HookPrerouting: true, nft.HookInput: true, nft.HookForward: true, nft.HookOutput: true},
}

// validate walks every chain reachable from a base chain, as the kernel
// does when it commits: loops, too deep nesting, and statements not
// allowed at the base chain's hook fail the transaction.
func (a *applier) validate() error {
	names := slices.Sorted(maps.Keys(a.t.chains))
	for _, n := range names {
		base := a.t.chains[n]
		if base.def.Hook == "" {
			continue
		}
		if err := a.walk(base, base, nil); err != nil {
			return err
		}
	}
	return nil
}

func (a *applier) walk(base, c *chain, stack []string) error {
	// The kernel finds loops by the nesting limit: EMLINK.
	if slices.Contains(stack, c.def.Name) {
		return &nft.OpError{Index: -1, Message: fmt.Sprintf("chain loop: %s -> %s", strings.Join(stack, " -> "), c.def.Name), Err: unix.EMLINK}
	}
	stack = append(stack, c.def.Name)
	if len(stack) > maxJumpDepth {
		return &nft.OpError{Index: -1, Message: "chains nested too deep: " + strings.Join(stack, " -> "), Err: unix.EMLINK}
	}
	for _, r := range c.rules {
		for _, st := range r.rule.Stmts {
			what := ""
			switch st.(type) {
			case nft.Masquerade:
				what = "masquerade"
			case nft.DNAT, nft.DNATMap, nft.DNATByService:
				what = "dnat"
			case nft.Reject:
				what = "reject"
			}
			if what == "" {
				continue
			}
			ok := stmtHooks[what][base.def.Hook]
			if what != "reject" && base.def.Type != nft.TypeNAT {
				ok = false
			}
			if !ok {
				oe := &nft.OpError{Index: r.op, Err: unix.EOPNOTSUPP,
					Message: fmt.Sprintf("%s in chain %s is reachable from base chain %s (%s hook %s)", what, c.def.Name, base.def.Name, base.def.Type, base.def.Hook)}
				if r.op >= 0 {
					oe.Op = a.tx.OpText(r.op)
				}
				return oe
			}
		}
		for _, t := range ruleTargets(r.rule) {
			if next := a.t.chains[t]; next != nil {
				if err := a.walk(base, next, stack); err != nil {
					return err
				}
			}
		}
		for _, sn := range ruleSets(r.rule) {
			s := a.t.sets[sn]
			if s == nil || !s.def.IsMap() {
				continue
			}
			for _, k := range slices.Sorted(maps.Keys(s.elems)) {
				v := s.elems[k].elem.Verdict
				if v == nil || (v.Kind != nft.Jump && v.Kind != nft.Goto) {
					continue
				}
				if next := a.t.chains[v.Chain]; next != nil {
					if err := a.walk(base, next, stack); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

// TableExists reports whether the table exists.
func (f *Fake) TableExists(ctx context.Context, family nft.Family, name string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.tables[tableKey{family, name}]
	return ok, nil
}

// ListTables returns the names of the family's tables, sorted.
func (f *Fake) ListTables(ctx context.Context, family nft.Family) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var names []string
	for k := range f.tables {
		if k.family == family {
			names = append(names, k.name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// ListChains returns the table's chain names, sorted.
func (f *Fake) ListChains(ctx context.Context, family nft.Family, name string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.tables[tableKey{family, name}]
	if !ok {
		return nil, fmt.Errorf("nft: table %s %s: %w", family, name, nft.ErrNotFound)
	}
	return slices.Sorted(maps.Keys(t.chains)), nil
}

// ListSets returns the table's set and map names, sorted.
func (f *Fake) ListSets(ctx context.Context, family nft.Family, name string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.tables[tableKey{family, name}]
	if !ok {
		return nil, fmt.Errorf("nft: table %s %s: %w", family, name, nft.ErrNotFound)
	}
	return slices.Sorted(maps.Keys(t.sets)), nil
}

// DeleteTable removes a table; a missing table is not an error.
func (f *Fake) DeleteTable(ctx context.Context, family nft.Family, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.tables, tableKey{family, name})
	return nil
}

// Chain returns a copy of a chain's definition and rules, or nil.
func (f *Fake) Chain(family nft.Family, tbl, name string) (*nft.Chain, []nft.Rule) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.tables[tableKey{family, tbl}]
	if t == nil || t.chains[name] == nil {
		return nil, nil
	}
	c := t.chains[name]
	def := c.def
	rules := make([]nft.Rule, len(c.rules))
	for i, r := range c.rules {
		rules[i] = r.rule
	}
	return &def, rules
}

// Set returns a copy of a set's definition and its elements in the
// canonical order, or nil.
func (f *Fake) Set(family nft.Family, tbl, name string) (*nft.Set, []nft.Element) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.tables[tableKey{family, tbl}]
	if t == nil || t.sets[name] == nil {
		return nil, nil
	}
	s := t.sets[name]
	def := s.def
	return &def, sortedElements(s)
}

func sortedElements(s *set) []nft.Element {
	out := make([]nft.Element, 0, len(s.elems))
	for _, e := range s.elems {
		out = append(out, e.elem)
	}
	slices.SortFunc(out, func(a, b nft.Element) int {
		return cmp.Or(compareKeys(a.Key, b.Key), cmp.Compare(a.Index, b.Index))
	})
	return out
}

func compareValues(a, b nft.Value) int {
	addr := func(v nft.Value) netip.Addr {
		if v.Addr.IsValid() {
			return v.Addr
		}
		return v.Prefix.Addr()
	}
	if c := addr(a).Compare(addr(b)); c != 0 {
		return c
	}
	bits := func(v nft.Value) int {
		if v.Prefix.IsValid() {
			return v.Prefix.Bits()
		}
		return -1
	}
	return cmp.Or(cmp.Compare(bits(a), bits(b)), cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.Port, b.Port))
}

func compareKeys(a, b []nft.Value) int {
	for i := range min(len(a), len(b)) {
		if c := compareValues(a[i], b[i]); c != 0 {
			return c
		}
	}
	return cmp.Compare(len(a), len(b))
}

// Dump returns the whole state as `nft -f` text in a canonical order:
// per table (ip before ip6, then by name) the table, its chains, its sets
// and maps (each sorted by name), the rules of each chain in order, and
// the elements of each set sorted by key. Feeding it to nft -f or to
// Load of a new Fake reproduces the state.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	keys := slices.SortedFunc(func(yield func(tableKey) bool) {
		for k := range f.tables {
			if !yield(k) {
				return
			}
		}
	}, func(a, b tableKey) int { return cmp.Or(cmp.Compare(a.family, b.family), cmp.Compare(a.name, b.name)) })
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(f.dumpTable(k).String())
	}
	return b.String()
}

// DumpTable returns one table as `nft -f` text (see Dump), or "".
func (f *Fake) DumpTable(family nft.Family, name string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.tables[tableKey{family, name}]; !ok {
		return ""
	}
	return f.dumpTable(tableKey{family, name}).String()
}

func (f *Fake) dumpTable(k tableKey) *nft.Transaction {
	t := f.tables[k]
	tx := nft.NewTransaction(k.family, k.name)
	tx.Add(&nft.Table{Family: k.family, Name: k.name, Comment: t.comment})
	chains := slices.Sorted(maps.Keys(t.chains))
	for _, n := range chains {
		def := t.chains[n].def
		tx.Add(&def)
	}
	sets := slices.Sorted(maps.Keys(t.sets))
	for _, n := range sets {
		def := t.sets[n].def
		tx.Add(&def)
	}
	for _, n := range chains {
		for _, r := range t.chains[n].rules {
			rule := r.rule
			tx.Add(&rule)
		}
	}
	for _, n := range sets {
		for _, e := range sortedElements(t.sets[n]) {
			tx.Add(&e)
		}
	}
	return tx
}

// Load applies text in the form Dump writes (see nft.Parse), one
// transaction per family, and records them like any Apply.
func (f *Fake) Load(text string) error {
	txs, err := nft.Parse(text)
	if err != nil {
		return err
	}
	for _, tx := range txs {
		if err := f.Apply(context.Background(), tx); err != nil {
			return err
		}
	}
	return nil
}
