package iptables

import (
	"errors"
	"fmt"
	"strings"
)

// ParseError is a problem in iptables-restore input, or an operation the
// kernel or iptables-restore would refuse (a rule in a missing chain,
// deleting a chain a rule still jumps to, a loop between chains, ...).
type ParseError struct {
	// Line is the 1-based line number in the data given to Parse or
	// Apply; 0 when the problem is not tied to one line (a missing COMMIT).
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

// token is one word of a line; quoted words are never taken for "!" or an
// option.
type token struct {
	s      string
	quoted bool
}

// tokenize splits a line the way iptables-restore does: words separated by
// blanks, double quotes group words, and inside quotes a backslash takes
// the next character literally (iptables-save writes a quote in a comment
// as \").
func tokenize(line string) ([]token, error) {
	var (
		toks    []token
		cur     strings.Builder
		inWord  bool
		quoted  bool
		inQuote bool
	)
	flush := func() {
		if inWord {
			toks = append(toks, token{s: cur.String(), quoted: quoted})
		}
		cur.Reset()
		inWord, quoted = false, false
	}
	for i := 0; i < len(line); i++ {
		ch := line[i]
		switch {
		case inQuote && ch == '\\' && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
		case inQuote && ch == '"':
			inQuote = false
		case inQuote:
			cur.WriteByte(ch)
		case ch == '"':
			inQuote, inWord, quoted = true, true, true
		case ch == ' ' || ch == '\t' || ch == '\r':
			flush()
		default:
			inWord = true
			cur.WriteByte(ch)
		}
	}
	if inQuote {
		return nil, errors.New("unterminated quoted string")
	}
	flush()
	return toks, nil
}

// quote writes a word so that tokenize reads it back unchanged.
func quote(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\"\\'!#") {
		return s
	}
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"` + r.Replace(s) + `"`
}
