// Package nfttest provides a stateful fake of nft.Interface for tests:
// it keeps tables, chains, sets, elements and rules in memory, rejects
// what the kernel rejects (with the kernel's errno: nftstate's applier in
// its Netlink dialect), applies each transaction atomically and dumps its
// state as `nft -f` text.
package nfttest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

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
	x, err := f.run(tx)
	if err == nil {
		err = opText(tx, x.Validate())
	}
	if err != nil {
		return fmt.Errorf("nft: check of a transaction of %d operations on %s: %w", tx.Len(), tx.Where(), err)
	}
	return nil
}

func (f *Fake) apply(tx *nft.Transaction) error {
	x, err := f.run(tx)
	if err != nil {
		return err
	}
	return opText(tx, x.Commit())
}

// run applies the operations of tx to a transaction on the state, with
// the kernel's checks (nftstate's Netlink dialect), without committing.
func (f *Fake) run(tx *nft.Transaction) (*nftstate.Txn, error) {
	if f.BeforeApply != nil {
		if err := f.BeforeApply(tx); err != nil {
			return nil, err
		}
	}
	x := f.state.Begin(nftstate.Netlink, 0)
	for i := range tx.Ops {
		op := &tx.Ops[i]
		p := &nft.Parsed{Family: tx.Family, Table: tx.TableOf(op), Op: *op}
		if err := x.Apply(p); err != nil {
			return nil, opText(tx, err)
		}
	}
	return x, nil
}

// opText adds the text of the operation an *nft.OpError names.
func opText(tx *nft.Transaction, err error) error {
	var oe *nft.OpError
	if errors.As(err, &oe) && oe.Index >= 0 && oe.Op == "" {
		oe.Op = tx.OpText(oe.Index)
	}
	return err
}
