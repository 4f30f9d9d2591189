package nftstate

import (
	"errors"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

// Dialect is how a Txn reports what it refuses, and the one operation
// only text has. The checks are the same in both: what the kernel
// refuses (with its errno), as the kernel conformance test of nfttest
// proves for the fake.
type Dialect int

const (
	// Netlink is the kernel's answer to a batch: an *nft.OpError naming
	// the operation by its index in the transaction (Op left for the
	// caller, who has the text), with the errno. Every check runs when
	// its operation does, as the kernel's do. nfttest.Fake uses it.
	Netlink Dialect = iota
	// File is `nft -f` reading a file: an error names the line of its
	// operation (nft.Read puts apply's errors on their line; Commit
	// returns an *nft.ParseError). What a rule or a map element names
	// (chains, sets) is checked at Commit, as nft does, so that a listing
	// may jump to a chain it lists further down. "delete rule" may name
	// the rule by its statements, as text.go prints a deletion. The
	// tracer uses it.
	File
)

// Txn is one transaction on a State. Operations apply to copies of the
// tables they touch; Commit validates those as the kernel does when it
// commits and stores them. A Txn dropped without Commit leaves the State
// as it was.
type Txn struct {
	st      *State
	dialect Dialect
	gen     int
	// work holds the copy of each table touched so far (nil: it does not
	// exist, or no longer); order is the order they were first touched.
	work  map[tableKey]*Table
	order []tableKey
	cur   tableKey
	t     *Table // work[cur]
	// lines holds the line of each operation applied so far (0 for
	// netlink): len(lines) is the index of the next one.
	lines []int
	// added maps the rules and elements this transaction added to their
	// operation.
	added      map[*Rule]int
	addedElems map[*Element]int
	// owned holds the sets this transaction made or copied: the ones it
	// may change (ownSet). The others are the State's, shared.
	owned map[*Set]bool
	// sortedMaps: during validate, each map's jump and goto elements in
	// the order the walk visits them, sorted once per table rather than
	// at every rule that names the map.
	sortedMaps map[string][]*Element
}

type tableKey struct {
	family nft.Family
	name   string
}

// Begin starts a transaction. gen is recorded in the rules it adds
// (Rule.Gen): the tracer's count of texts, to tell this text's lines
// from earlier ones.
func (s *State) Begin(d Dialect, gen int) *Txn {
	return &Txn{st: s, dialect: d, gen: gen, work: map[tableKey]*Table{}, added: map[*Rule]int{}, addedElems: map[*Element]int{}, owned: map[*Set]bool{}}
}

// Table returns a table as the transaction sees it so far, or nil. The
// caller must not change it.
func (x *Txn) Table(f nft.Family, name string) *Table {
	if t, ok := x.work[tableKey{f, name}]; ok {
		return t
	}
	return x.st.Table(f, name)
}

// SetDef is an nft.SetLookup over the transaction's tables.
func (x *Txn) SetDef(f nft.Family, table, name string) *nft.Set {
	if t := x.Table(f, table); t != nil && t.Sets[name] != nil {
		return &t.Sets[name].Def
	}
	return nil
}

// use makes a table current, copying it on first use.
func (x *Txn) use(k tableKey) {
	if x.cur == k && x.t != nil {
		return
	}
	x.cur = k
	t, ok := x.work[k]
	if !ok {
		if old := x.st.Table(k.family, k.name); old != nil {
			t = old.cloneSharingSets()
		}
		x.work[k] = t
		x.order = append(x.order, k)
	}
	x.t = t
}

// ownSet is set s of the current table as this transaction may change
// it: s itself when the transaction made or copied it, else a copy that
// takes its place in the transaction's table.
func (x *Txn) ownSet(s *Set) *Set {
	if x.owned[s] {
		return s
	}
	c := s.clone()
	x.t.Sets[c.Def.Name] = c
	x.owned[c] = true
	return c
}

// kerr is a refusal with the kernel's errno and nft's wording.
func kerr(errno unix.Errno, format string, args ...any) error {
	return &nft.ErrnoError{Msg: fmt.Sprintf(format, args...), Errno: errno}
}

// Apply applies one operation (Op.In is ignored: Table names the table).
// A refusal is reported in the dialect's form (see Dialect); the
// transaction should then be dropped.
func (x *Txn) Apply(p *nft.Parsed) error {
	i := len(x.lines)
	x.lines = append(x.lines, p.Line)
	if p.Family != nft.IPv4 && p.Family != nft.IPv6 {
		return x.refuse(i, kerr(unix.EAFNOSUPPORT, "unsupported family %q", p.Family))
	}
	x.use(tableKey{p.Family, p.Table})
	err := x.do(i, p)
	x.work[x.cur] = x.t // table operations create or delete it
	if x.dialect == File {
		return err // nft.Read puts it on its line
	}
	return x.refuse(i, err)
}

// refuse puts err in the dialect's form for operation i (-1: the
// transaction). In the File dialect it is for what Commit finds, after
// nft.Read is done with the lines.
func (x *Txn) refuse(i int, err error) error {
	if err == nil {
		return nil
	}
	if x.dialect == File {
		if i < 0 {
			return &nft.ParseError{Err: err}
		}
		return &nft.ParseError{Line: x.lines[i], Err: err}
	}
	var oe *nft.OpError
	if errors.As(err, &oe) {
		return err
	}
	oe = &nft.OpError{Index: i, Err: err}
	var ee *nft.ErrnoError
	if errors.As(err, &ee) {
		oe.Message, oe.Err = ee.Msg, ee.Errno
	}
	return oe
}

func (x *Txn) do(i int, p *nft.Parsed) error {
	op := &p.Op
	if err := nft.CheckComment(op.Comment()); err != nil {
		return err
	}
	if op.Table != nil {
		return x.tableOp(p)
	}
	if x.t == nil {
		return kerr(unix.ENOENT, "table %s %s does not exist", x.cur.family, x.cur.name)
	}
	switch {
	case op.Chain != nil:
		return x.chainOp(p)
	case op.Set != nil:
		return x.setOp(p)
	case op.Element != nil:
		return x.elementOp(i, p)
	case op.Rule != nil:
		return x.ruleOp(i, p)
	}
	return kerr(unix.EINVAL, "operation without an object")
}

func (x *Txn) tableOp(p *nft.Parsed) error {
	switch p.Op.Kind {
	case nft.OpAdd:
		if x.t != nil && p.Create {
			return kerr(unix.EEXIST, "table %s %s exists", x.cur.family, x.cur.name)
		}
		// Re-adding a table keeps its comment, as the kernel does.
		if x.t == nil {
			x.t = NewTable(x.cur.family, x.cur.name)
			x.t.Comment = p.Op.Table.Comment
		}
	case nft.OpFlush:
		if x.t == nil {
			return kerr(unix.ENOENT, "table %s %s does not exist", x.cur.family, x.cur.name)
		}
		// "flush table" removes every rule; chains, sets and their
		// elements stay.
		for _, c := range x.t.Chains {
			c.Rules = nil
		}
	case nft.OpDelete:
		if x.t == nil {
			return kerr(unix.ENOENT, "table %s %s does not exist", x.cur.family, x.cur.name)
		}
		x.t = nil
	default:
		return kerr(unix.EINVAL, "unknown operation %q", p.Op.Kind)
	}
	return nil
}

var hooks = map[string]bool{nft.HookPrerouting: true, nft.HookInput: true, nft.HookForward: true, nft.HookOutput: true, nft.HookPostrouting: true}

func (x *Txn) chainOp(p *nft.Parsed) error {
	c := p.Op.Chain
	if c.Name == "" {
		return kerr(unix.EINVAL, "chain without a name")
	}
	old := x.t.Chains[c.Name]
	switch p.Op.Kind {
	case nft.OpAdd:
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
			x.t.AddChain(&Chain{Def: *c, Policy: p.Policy, Line: p.Line})
			return nil
		}
		if p.Create {
			return kerr(unix.EEXIST, "chain %s exists", c.Name)
		}
		switch {
		case c.Hook == "":
			// Adding a chain that exists is a no-op, also for a base
			// chain; its comment stays.
		case old.Def.Hook == "":
			return kerr(unix.EEXIST, "chain %s exists and is not a base chain", c.Name)
		case old.Def.Hook != c.Hook || old.Def.Type != c.Type || old.Def.Priority != c.Priority:
			return kerr(unix.EOPNOTSUPP, "base chain %s exists with a different type, hook or priority", c.Name)
		case p.Policy != "":
			// The policy of a base chain may change.
			old.Policy = p.Policy
		}
	case nft.OpFlush:
		if old == nil {
			return kerr(unix.ENOENT, "chain %s does not exist", c.Name)
		}
		old.Rules = nil
	case nft.OpDelete:
		if old == nil {
			return kerr(unix.ENOENT, "chain %s does not exist", c.Name)
		}
		// The kernel deletes the chain's own rules with it, but refuses
		// while anything else still jumps to it (EBUSY): that is why
		// stale chains are flushed, unreferenced, then deleted.
		if by := x.chainUser(c.Name); by != "" {
			return kerr(unix.EBUSY, "chain %s is still used by %s", c.Name, by)
		}
		x.t.DeleteChain(c.Name)
	default:
		return kerr(unix.EINVAL, "unknown operation %q", p.Op.Kind)
	}
	return nil
}

// chainUser names something other than the chain's own rules that jumps
// or goes to it, or "".
func (x *Txn) chainUser(name string) string {
	for _, cn := range x.t.ChainOrder {
		if cn == name {
			continue
		}
		for _, r := range x.t.Chains[cn].Rules {
			if slices.Contains(ruleTargets(r.Rule), name) {
				return "a rule in chain " + cn
			}
		}
	}
	for _, sn := range x.t.SetOrder {
		for _, e := range x.t.Sets[sn].Elems {
			if v := e.Verdict; v != nil && (v.Kind == nft.Jump || v.Kind == nft.Goto) && v.Chain == name {
				return "an element of map " + sn
			}
		}
	}
	return ""
}

// Validate checks every table the transaction touched as the kernel does
// when it commits (see validate), and in the File dialect what the rules
// and map elements it added name. The State is not changed: Check of a
// transaction is Apply of each operation and Validate.
func (x *Txn) Validate() error {
	for _, k := range x.order {
		if x.t = x.work[k]; x.t == nil {
			continue
		}
		x.cur = k
		if x.dialect == File {
			if err := x.checkAdded(); err != nil {
				return err
			}
		}
		if err := x.validate(); err != nil {
			return err
		}
	}
	return nil
}

// Commit validates the transaction and stores its tables in the State.
func (x *Txn) Commit() error {
	if err := x.Validate(); err != nil {
		return err
	}
	// The State's table list may be shared with a copy (the nftables tracer's Of):
	// replace it rather than change it in place.
	x.st.Tables = slices.Clone(x.st.Tables)
	for _, k := range x.order {
		if t := x.work[k]; t != nil {
			x.st.Put(t)
		} else {
			x.st.Delete(k.family, k.name)
		}
	}
	return nil
}

// checkAdded checks the statements of the rules and the verdicts of the
// map elements the transaction added to the current table, in the File
// dialect where they wait for the whole text.
func (x *Txn) checkAdded() error {
	for _, cn := range x.t.ChainOrder {
		for _, r := range x.t.Chains[cn].Rules {
			i, ok := x.added[r]
			if !ok {
				continue
			}
			if err := x.checkRule(r.Rule); err != nil {
				return x.refuse(i, err)
			}
		}
	}
	for _, sn := range x.t.SetOrder {
		for _, e := range x.t.Sets[sn].Elems {
			i, ok := x.addedElems[e]
			if !ok || e.Verdict == nil {
				continue
			}
			if err := x.checkJump(*e.Verdict); err != nil {
				return x.refuse(i, err)
			}
		}
	}
	return nil
}
