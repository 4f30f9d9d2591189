// Package faultplan is the part every stateful kernel fake shares: it
// counts calls per operation and hands out the errors a test injected
// (the next calls of an operation, or every call until cleared). A fake
// embeds a Plan, so tests call FailNext, FailAlways, Calls and ResetCalls
// on the fake, and the fake calls Enter at the start of each operation.
package faultplan

import "sync"

// Plan is ready to use as its zero value and safe for concurrent use.
type Plan[Op comparable] struct {
	mu     sync.Mutex
	calls  map[Op]int
	next   map[Op][]error
	always map[Op]error
}

// FailNext makes the next calls of op return errs in turn (a nil one lets
// that call through), then op works again.
func (p *Plan[Op]) FailNext(op Op, errs ...error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.next == nil {
		p.next = map[Op][]error{}
	}
	p.next[op] = append(p.next[op], errs...)
}

// FailAlways makes every call of op return err until FailAlways(op, nil).
func (p *Plan[Op]) FailAlways(op Op, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil {
		delete(p.always, op)
		return
	}
	if p.always == nil {
		p.always = map[Op]error{}
	}
	p.always[op] = err
}

// Calls returns how often op was called (failed calls included).
func (p *Plan[Op]) Calls(op Op) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[op]
}

// ResetCalls zeroes the counters.
func (p *Plan[Op]) ResetCalls() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = nil
}

// Enter counts a call of op and returns the error injected for it, if
// any: the next one queued by FailNext first, else FailAlways's.
func (p *Plan[Op]) Enter(op Op) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.calls == nil {
		p.calls = map[Op]int{}
	}
	p.calls[op]++
	if q := p.next[op]; len(q) > 0 {
		p.next[op] = q[1:]
		if q[0] != nil {
			return q[0]
		}
	}
	return p.always[op]
}
