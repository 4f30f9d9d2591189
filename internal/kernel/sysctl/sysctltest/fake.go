// Package sysctltest is a stateful fake of sysctl.Interface.
package sysctltest

import (
	"fmt"
	"io/fs"
	"sort"
	"strings"

	"github.com/kproxy/kproxy/internal/kernel/sysctl"
)

// Fake holds parameter values in memory. Like the kernel, it refuses to
// read or write a parameter that does not exist and to write a read-only one
// (nf_conntrack_max outside the initial network namespace).
type Fake struct {
	Values   map[string]int
	ReadOnly map[string]bool
	// Writes lists every successful Set as "path=value", in order.
	Writes []string
}

var _ sysctl.Interface = (*Fake)(nil)

// New returns a Fake holding values.
func New(values map[string]int) *Fake {
	f := &Fake{Values: map[string]int{}, ReadOnly: map[string]bool{}}
	for k, v := range values {
		f.Values[k] = v
	}
	return f
}

func (f *Fake) Get(path string) (int, error) {
	v, ok := f.Values[path]
	if !ok {
		return 0, fmt.Errorf("reading %s: %w", path, fs.ErrNotExist)
	}
	return v, nil
}

func (f *Fake) Set(path string, value int) error {
	if _, ok := f.Values[path]; !ok {
		return fmt.Errorf("writing %s=%d: %w", path, value, fs.ErrNotExist)
	}
	if f.ReadOnly[path] {
		return fmt.Errorf("writing %s=%d: %w", path, value, fs.ErrPermission)
	}
	f.Values[path] = value
	f.Writes = append(f.Writes, fmt.Sprintf("%s=%d", path, value))
	return nil
}

// Dump lists the values as "path=value" lines, sorted.
func (f *Fake) Dump() string {
	lines := make([]string, 0, len(f.Values))
	for k, v := range f.Values {
		lines = append(lines, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
