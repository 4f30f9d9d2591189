package iptables

import (
	"errors"
	"fmt"
)

// ParseError is a problem in iptables-restore input, or an operation the
// kernel or iptables-restore would refuse (a rule in a missing chain,
// deleting a chain a rule still jumps to, a loop between chains, ...).
type ParseError struct {
	// Line is the 1-based line number in the data given to Parse or
	// Apply; 0 when no line of it is to blame (a table refused at COMMIT
	// for rules of earlier restores only).
	Line int
	Text string // that line, trimmed
	Err  error
}

func (e *ParseError) Error() string {
	if e.Line == 0 {
		return e.Err.Error()
	}
	return fmt.Sprintf("line %d: %v: %q", e.Line, e.Err, e.Text)
}

func (e *ParseError) Unwrap() error { return e.Err }

// ErrUnsupported is wrapped by errors about valid iptables syntax that the
// tracer does not model (a match, a target or an option). Such a rule is
// refused rather than skipped: a tracer that skipped it would describe a
// ruleset that does not exist.
var ErrUnsupported = errors.New("not supported by the tracer")

func unsupported(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrUnsupported)
}
