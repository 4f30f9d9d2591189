package iptables

import (
	"errors"
	"fmt"
)

// ErrUnsupported is wrapped by errors about valid iptables syntax that the
// tracer does not model (a match, a target or an option). Such a rule is
// refused rather than skipped: a tracer that skipped it would describe a
// ruleset that does not exist.
var ErrUnsupported = errors.New("not supported by the tracer")

func unsupported(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrUnsupported)
}
