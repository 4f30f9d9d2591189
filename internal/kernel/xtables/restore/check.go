package restore

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
)

// check does what the kernel does when the current table is committed:
// following jumps and gotos from each built-in chain there is no loop,
// and every target is reachable only from hooks it supports. Like the
// kernel it checks only what the hooks reach: a loop between chains
// nothing jumps to is accepted.
func (r *run[S]) check() error {
	t := r.cur
	const (
		white = iota
		gray
		black
	)
	for _, hook := range xtables.BuiltinChains[t.Name] {
		color := map[string]int{}
		var visit func(c *Chain[S], path []*Rule[S]) error
		visit = func(c *Chain[S], path []*Rule[S]) error {
			color[c.Name] = gray
			for i := range c.Rules {
				ru := &c.Rules[i]
				if info := targets[ru.Target]; info != nil && len(info.hooks) > 0 && !slices.Contains(info.hooks, hook) {
					return r.commitError(append(path, ru), "target %s in chain %s is reached from hook %s; the kernel allows it only on %s (Invalid argument)",
						ru.Target, c.Name, hook, strings.Join(info.hooks, ", "))
				}
				next := t.chains[ru.Target]
				if next == nil || next.Builtin {
					continue
				}
				switch color[next.Name] {
				case gray:
					return r.commitError(append(path, ru), "chain %s jumps back to %s: the kernel refuses loops of jumps (Too many levels of symbolic links)", c.Name, next.Name)
				case white:
					if err := visit(next, append(path, ru)); err != nil {
						return err
					}
				}
			}
			color[c.Name] = black
			return nil
		}
		if err := visit(t.chains[hook], nil); err != nil {
			return err
		}
	}
	return nil
}

// commitError is an error of the COMMIT line that also names the latest
// rule of this input on the path that led to it.
func (r *run[S]) commitError(path []*Rule[S], format string, args ...any) *Error {
	e := &Error{Line: r.n, Text: r.line, Err: fmt.Errorf(format, args...), AtCommit: true}
	for i := len(path) - 1; i >= 0; i-- {
		if ru := path[i]; ru.restore == r.ts.restores {
			e.RuleLine, e.RuleText = ru.Line, strings.TrimSpace(r.lines[ru.Line-1])
			break
		}
	}
	return e
}
