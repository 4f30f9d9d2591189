// Package nfttest provides a stateful fake of nft.Interface for tests:
// it keeps tables, chains, sets, elements and rules in memory, rejects
// what the kernel rejects (with the kernel's errno), applies each
// transaction atomically and dumps its state as `nft -f` text.
package nfttest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/nft/nftstate"
)

// Fake is an in-memory nf_tables. The zero value is not usable; use New.
type Fake struct {
	mu      sync.Mutex
	state   *nftstate.State
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
func New() *Fake { return &Fake{state: &nftstate.State{}} }

type (
	table = nftstate.Table
	chain = nftstate.Chain
	set   = nftstate.Set
)

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
	saved := f.state
	f.state = &nftstate.State{Tables: slices.Clone(saved.Tables)} // apply copies a table before changing it
	err := f.apply(tx)
	f.state = saved
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
	a := &applier{f: f, tx: tx, work: map[string]*table{}, added: map[*nftstate.Rule]int{}}
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
		if t := a.work[name]; t != nil {
			f.state.Put(t)
		} else {
			f.state.Delete(tx.Family, name)
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
	// added maps the rules this transaction added to their operation.
	added map[*nftstate.Rule]int
}

// opOf is the index of the operation that added r in this transaction,
// or -1.
func (a *applier) opOf(r *nftstate.Rule) int {
	if i, ok := a.added[r]; ok {
		return i
	}
	return -1
}

// use makes the table of an operation current, copying it on first use.
func (a *applier) use(name string) {
	if a.cur == name && a.t != nil {
		return
	}
	a.cur = name
	t, ok := a.work[name]
	if !ok {
		if old := a.f.state.Table(a.tx.Family, name); old != nil {
			t = old.Clone()
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
			a.t = nftstate.NewTable(a.tx.Family, a.cur)
			a.t.Comment = op.Table.Comment
		}
	case nft.OpFlush:
		if a.t == nil {
			return kerr(unix.ENOENT, "table does not exist")
		}
		// "flush table" removes every rule; sets keep their elements.
		for _, c := range a.t.Chains {
			c.Rules = nil
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
	old := a.t.Chains[c.Name]
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
			a.t.AddChain(&chain{Def: *c})
			return nil
		}
		switch {
		case c.Hook == "":
			// Adding a chain that exists is a no-op, also for a base chain.
		case old.Def.Hook == "":
			return kerr(unix.EEXIST, "chain %s exists and is not a base chain", c.Name)
		case old.Def.Hook != c.Hook || old.Def.Type != c.Type || old.Def.Priority != c.Priority:
			return kerr(unix.EOPNOTSUPP, "base chain %s exists with a different type, hook or priority", c.Name)
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
		if len(old.Rules) > 0 {
			return kerr(unix.EBUSY, "chain %s still has rules (flush it first)", c.Name)
		}
		if by := a.chainUser(c.Name); by != "" {
			return kerr(unix.EBUSY, "chain %s is still used by %s", c.Name, by)
		}
		a.t.DeleteChain(c.Name)
	default:
		return kerr(unix.EINVAL, "unknown operation %q", kind)
	}
	return nil
}

// chainUser names something that jumps to the chain, or "".
func (a *applier) chainUser(name string) string {
	for cn, c := range a.t.Chains {
		for _, r := range c.Rules {
			for _, t := range ruleTargets(r.Rule) {
				if t == name {
					return "a rule in chain " + cn
				}
			}
		}
	}
	for sn, s := range a.t.Sets {
		for _, e := range s.Elems {
			if v := e.Verdict; v != nil && (v.Kind == nft.Jump || v.Kind == nft.Goto) && v.Chain == name {
				return "an element of map " + sn
			}
		}
	}
	return ""
}
