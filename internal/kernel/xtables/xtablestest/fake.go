// Package xtablestest has an in-memory xtables.Interface for the tests of
// code that writes iptables rules.
//
// The Fake restores with package restore, the iptables-restore simulator
// it shares with the iptables tracer, and so rejects what
// iptables-restore or the kernel would reject: an unknown table, a
// missing COMMIT, a rule in a chain that does not exist, a jump to a chain
// that does not exist (yet: chains must be declared before the rules that
// jump to them), deleting a chain that is not empty or that a rule still
// jumps to, a loop of jumps that a built-in chain reaches,
// DNAT/SNAT/MASQUERADE/REDIRECT outside the nat table or reachable from a
// hook where the kernel refuses them, REJECT outside filter. Where the two
// backends differ it follows the stricter one (legacy): a user chain
// declared twice in a flushing restore, or a user chain with a policy, is
// an error. On top it records every call and can fail them on demand
// (RestoreHook).
//
// Errors are *xtables.RestoreError naming the input line, as the real
// backends do; checks the kernel makes when a table is committed (loops,
// hooks) name the COMMIT line, as legacy does (nft names the rule). A
// kernel test runs the same inputs through both backends and the Fake and
// compares what they accept and hold.
//
// It does not canonicalize rules as iptables-save does (`-p tcp --dport
// 80` is not turned into `-p tcp -m tcp --dport 80`, addresses get no
// /32): Save prints rules as they were given, fields quoted as needed,
// and `-D` with a rule matches the same fields only. It checks no match
// or target options.
package xtablestest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/kernel/xtables/restore"
)

// Fake is a stateful in-memory xtables.Interface of one backend and
// family. It is safe for concurrent use. Its exported fields must be set
// before use.
type Fake struct {
	// CommitPerTable makes Restore commit each table at its COMMIT line as
	// iptables-restore does, so that a failed call keeps the tables
	// before the failing one. By default a failed call changes nothing.
	CommitPerTable bool
	// RestoreHook, if set, runs first in every Restore; an error it
	// returns fails the call (logged, nothing changed). Tests use it to
	// inject failures, for example an error wrapping xtables.ErrLockTimeout.
	RestoreHook func(data []byte, opts xtables.RestoreOptions) error
	// Stats is what RestoreWithStats reports.
	Stats xtables.RestoreStats
	// VersionString is what Version returns; NewFake sets "1.8.9".
	VersionString string

	backend xtables.Backend
	family  xtables.Family

	mu       sync.Mutex
	tables   *restore.Tables[fields]
	restores []RestoreCall
}

var _ xtables.Interface = (*Fake)(nil)

// RestoreCall is one Restore call, as the Fake logs it.
type RestoreCall struct {
	Data    []byte
	NoFlush bool
	// Test: the call only checked the input (--test).
	Test bool
	// Err is the error the call returned, nil if it succeeded.
	Err error
}

// NewFake returns a Fake with no tables, as a fresh network namespace.
func NewFake(b xtables.Backend, f xtables.Family) *Fake {
	return &Fake{backend: b, family: f, tables: &restore.Tables[fields]{}, VersionString: "1.8.9"}
}

func (f *Fake) Backend() xtables.Backend { return f.backend }
func (f *Fake) Family() xtables.Family   { return f.family }

// Version returns VersionString.
func (f *Fake) Version(context.Context) (string, error) { return f.VersionString, nil }

// Restore implements xtables.Interface.
func (f *Fake) Restore(ctx context.Context, data []byte, opts xtables.RestoreOptions) error {
	_, err := f.RestoreWithStats(ctx, data, opts)
	return err
}

// RestoreWithStats implements xtables.Interface.
func (f *Fake) RestoreWithStats(_ context.Context, data []byte, opts xtables.RestoreOptions) (xtables.RestoreStats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var err error
	if f.RestoreHook != nil {
		err = f.RestoreHook(data, opts)
	}
	if err == nil {
		ropts := restore.Options{NoFlush: opts.NoFlush, PerTable: f.CommitPerTable}
		tables := f.tables
		if opts.Test {
			// Checked on a copy that is thrown away; iptables-nft-restore
			// --test resolves no chain.
			tables = tables.Clone()
			ropts.SyntaxOnly = f.backend == xtables.NFT
		}
		err = f.restoreError(tables.Restore(data, ropts, dialect{}))
	}
	f.restores = append(f.restores, RestoreCall{Data: slices.Clone(data), NoFlush: opts.NoFlush, Test: opts.Test, Err: err})
	if err != nil {
		return xtables.RestoreStats{}, err
	}
	return f.Stats, nil
}

// Save implements xtables.Interface. Like the real backends, the legacy
// Fake creates a table that does not exist yet; the nft one prints its
// empty built-in chains without creating it.
func (f *Fake) Save(_ context.Context, name string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Contains(xtables.Tables, name) {
		return nil, fmt.Errorf("xtablestest: saving %s %s table %s: unknown table", f.backend, f.family, name)
	}
	t := f.tables.Table(name)
	switch {
	case t != nil:
	case f.backend == xtables.Legacy:
		t = f.tables.Create(name)
	default:
		t = restore.NewTable[fields](name)
	}
	return []byte(t.Save(dialect{})), nil
}

// Restores returns the log of Restore calls, oldest first.
func (f *Fake) Restores() []RestoreCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.restores)
}

// ClearRestores empties the log of Restore calls.
func (f *Fake) ClearRestores() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.restores = nil
}

// Tables lists the tables that exist, in xtables.Tables order.
func (f *Fake) Tables() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, n := range xtables.Tables {
		if f.tables.Table(n) != nil {
			out = append(out, n)
		}
	}
	return out
}

// Dump returns every existing table in iptables-save syntax, in
// xtables.Tables order. It creates nothing.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	for _, n := range xtables.Tables {
		if t := f.tables.Table(n); t != nil {
			b.WriteString(t.Save(dialect{}))
		}
	}
	return b.String()
}

// Chains lists the chains of a table as Save prints them: built-in chains
// in hook order, then user chains sorted. Nil if the table does not exist.
func (f *Fake) Chains(table string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.tables.Table(table)
	if t == nil {
		return nil
	}
	return t.Chains()
}

// Rules returns the rules of a chain as Save prints them ("-A CHAIN ...").
// Nil if the table or chain does not exist.
func (f *Fake) Rules(table, chain string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.tables.Table(table)
	if t == nil || t.Chain(chain) == nil {
		return nil
	}
	var out []string
	for _, r := range t.Chain(chain).Rules {
		out = append(out, restore.RuleText(chain, r.Spec, dialect{}))
	}
	return out
}

// fields are what the Fake keeps of a rule: its words after "-A CHAIN",
// as given.
type fields []string

// dialect is the Fake's restore.Dialect: a rule is its words; -D deletes
// a rule with the same words.
type dialect struct{}

func (dialect) Begin(string)  {}
func (dialect) Commit(string) {}

func (dialect) Rule(_ *restore.Table[fields], _ *restore.Chain[fields], words []xtables.Token) ([]fields, error) {
	f := make(fields, len(words))
	for i, w := range words {
		f[i] = w.Text
	}
	return []fields{f}, nil
}

func (dialect) Same(a, b fields) bool { return slices.Equal(a, b) }

// Text quotes the words as iptables-save does: a comment as a string
// argument, anything else only if it has to be.
func (dialect) Text(f fields) string {
	var b strings.Builder
	for i, w := range f {
		if i > 0 {
			b.WriteByte(' ')
		}
		if i > 0 && f[i-1] == "--comment" {
			b.WriteString(xtables.SaveString(w))
		} else {
			b.WriteString(xtables.Quote(w))
		}
	}
	return b.String()
}

// restoreError turns an error of the restore core into the
// *xtables.RestoreError the real backends return, naming the line as
// iptables-legacy-restore does (a table the kernel refuses at its
// COMMIT line).
func (f *Fake) restoreError(err error) error {
	if err == nil {
		return nil
	}
	re := &xtables.RestoreError{Backend: f.backend, Family: f.family, Detail: err.Error()}
	var e *restore.Error
	if errors.As(err, &e) {
		re.Line, re.Detail = e.Line, e.Err.Error()
	}
	return re
}
