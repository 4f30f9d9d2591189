// Package ipsettest holds a stateful fake of ipset.Handle for unit tests
// of ipvs mode: sets with their type and family, members validated and
// kept in ipset's text form as the kernel would (a member of the wrong
// shape or family is ipset.ErrBadEntry, a duplicate ipset.ErrEntryExists,
// ...; the VM test in package ipset checks the fake against the kernel).
package ipsettest

import (
	"fmt"
	"slices"
	"sync"

	"github.com/kproxy/kproxy/internal/kernel/ipset"
	"github.com/kproxy/kproxy/internal/testutil/faultplan"
)

// Op names one Handle method.
type Op string

// The operations a Fake counts and can fail.
const (
	OpSets    Op = "Sets"
	OpCreate  Op = "Create"
	OpDestroy Op = "Destroy"
	OpEntries Op = "Entries"
	OpAdd     Op = "Add"
	OpDel     Op = "Del"
)

type set struct {
	def     ipset.Set
	entries map[string]bool // canonical text
	inUse   bool
}

// Fake is an in-memory ipset.Handle; make one with New. It is safe for
// concurrent use.
type Fake struct {
	mu   sync.Mutex
	sets map[string]*set
	faultplan.Plan[Op]
	closed bool
}

// New returns a fake without sets.
func New() *Fake {
	return &Fake{sets: map[string]*set{}}
}

var _ ipset.Handle = (*Fake)(nil)

// SetInUse marks a set as matched by an iptables rule: Destroy fails
// with ipset.ErrInUse while it is.
func (f *Fake) SetInUse(name string, inUse bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sets[name]
	if !ok {
		return fmt.Errorf("%w: %s", ipset.ErrNoSet, name)
	}
	s.inUse = inUse
	return nil
}

// Set returns a set's definition as created.
func (f *Fake) Set(name string) (ipset.Set, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sets[name]
	if !ok {
		return ipset.Set{}, false
	}
	return s.def, true
}

// Closed says whether Close was called.
func (f *Fake) Closed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}

func (f *Fake) enter(op Op) error { return f.Enter(op) }

func (f *Fake) get(name string) (*set, error) {
	s, ok := f.sets[name]
	if !ok {
		return nil, fmt.Errorf("ipset %s: %w", name, ipset.ErrNoSet)
	}
	return s, nil
}

// Sets implements ipset.Handle; the names are sorted.
func (f *Fake) Sets() ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(OpSets); err != nil {
		return nil, err
	}
	out := make([]string, 0, len(f.sets))
	for n := range f.sets {
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

// Create implements ipset.Handle.
func (f *Fake) Create(s ipset.Set) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(OpCreate); err != nil {
		return err
	}
	if err := ipset.CheckSet(s); err != nil {
		return err
	}
	if cur, ok := f.sets[s.Name]; ok {
		if cur.def.Type != s.Type || cur.def.IPv6 != s.IPv6 {
			return fmt.Errorf("creating ipset %s (%s): %w: %s", s.Name, s.Type, ipset.ErrSetExists, cur.def.Type)
		}
		return nil
	}
	f.sets[s.Name] = &set{def: s, entries: map[string]bool{}}
	return nil
}

// Destroy implements ipset.Handle.
func (f *Fake) Destroy(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(OpDestroy); err != nil {
		return err
	}
	s, err := f.get(name)
	if err != nil {
		return err
	}
	if s.inUse {
		return fmt.Errorf("destroying ipset %s: %w", name, ipset.ErrInUse)
	}
	delete(f.sets, name)
	return nil
}

// Entries implements ipset.Handle; the entries are sorted.
func (f *Fake) Entries(name string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(OpEntries); err != nil {
		return nil, err
	}
	s, err := f.get(name)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(s.entries))
	for e := range s.entries {
		out = append(out, e)
	}
	slices.Sort(out)
	return out, nil
}

func (f *Fake) entry(op Op, name, entry string) (*set, string, error) {
	if err := f.enter(op); err != nil {
		return nil, "", err
	}
	s, err := f.get(name)
	if err != nil {
		return nil, "", err
	}
	c, err := ipset.Canonical(s.def.Type, s.def.IPv6, entry)
	if err != nil {
		return nil, "", fmt.Errorf("ipset %s: %w", name, err)
	}
	return s, c, nil
}

// Add implements ipset.Handle.
func (f *Fake) Add(name, entry string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, c, err := f.entry(OpAdd, name, entry)
	if err != nil {
		return err
	}
	if s.entries[c] {
		return fmt.Errorf("adding %s to ipset %s: %w", entry, name, ipset.ErrEntryExists)
	}
	s.entries[c] = true
	return nil
}

// Del implements ipset.Handle.
func (f *Fake) Del(name, entry string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, c, err := f.entry(OpDel, name, entry)
	if err != nil {
		return err
	}
	if !s.entries[c] {
		return fmt.Errorf("deleting %s from ipset %s: %w", entry, name, ipset.ErrNoEntry)
	}
	delete(s.entries, c)
	return nil
}

// Close implements ipset.Handle.
func (f *Fake) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
}
