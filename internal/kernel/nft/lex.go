package nft

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ParseError is a problem in nft text, or (from Read) an operation its
// caller refused (the tracer: a rule in a missing chain, deleting a
// referenced chain...). The iptables tracer reports the problems of
// iptables-restore input with it too (as trace.ParseError).
type ParseError struct {
	// Line is the 1-based line number in the text; 0 when the problem
	// lies in what an earlier text added.
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

// token is one word of a line. Quoted strings keep their unquoted value and
// are flagged so that a comment "{" is never taken for a brace.
type token struct {
	s      string
	quoted bool
}

// tokenize splits one line. Braces, semicolons and commas are tokens of
// their own even when glued to a word ("accept;", "dynamic,timeout", "a,"):
// no name or value kproxy writes contains them. Colons are not split: they
// occur inside IPv6 addresses and "addr:port", and the ':' of map elements is
// always surrounded by spaces, in text.go's output and in nft's own. A '#'
// outside quotes starts a comment (nft -a prints "# handle N").
func tokenize(line string) ([]token, error) {
	var toks []token
	i := 0
	for i < len(line) {
		c := line[i]
		switch {
		case c == ' ' || c == '\t' || c == '\r':
			i++
		case c == '#':
			return toks, nil
		case c == '{' || c == '}' || c == ';' || c == ',':
			toks = append(toks, token{s: string(c)})
			i++
		case c == '"':
			q, err := strconv.QuotedPrefix(line[i:])
			if err != nil {
				return nil, errors.New("unterminated or invalid quoted string")
			}
			s, err := strconv.Unquote(q)
			if err != nil {
				return nil, fmt.Errorf("invalid quoted string %s", q)
			}
			toks = append(toks, token{s: s, quoted: true})
			i += len(q)
		default:
			j := i
			for j < len(line) && !strings.ContainsRune(" \t\r#{};,\"", rune(line[j])) {
				j++
			}
			toks = append(toks, token{s: line[i:j]})
			i = j
		}
	}
	return toks, nil
}

// cursor walks the tokens of one line.
type cursor struct {
	toks []token
	pos  int
	// lossy names the first thing read that the objects do not keep
	// (see Parsed.Lossy).
	lossy string
}

// drop notes that what was just read is not kept in the objects.
func (c *cursor) drop(what string) {
	if c.lossy == "" {
		c.lossy = what
	}
}

func (c *cursor) done() bool { return c.pos >= len(c.toks) }

// peek returns the next bare word, or "" at the end or before a quoted string.
func (c *cursor) peek() string {
	if c.done() || c.toks[c.pos].quoted {
		return ""
	}
	return c.toks[c.pos].s
}

// word consumes a bare word.
func (c *cursor) word(what string) (string, error) {
	if c.done() {
		return "", fmt.Errorf("expected %s, found end of line", what)
	}
	t := c.toks[c.pos]
	if t.quoted {
		return "", fmt.Errorf("expected %s, found quoted string %q", what, t.s)
	}
	c.pos++
	return t.s, nil
}

// quoted consumes a quoted string (or a bare word: nft accepts both for
// comments and interface names).
func (c *cursor) quoted(what string) (string, error) {
	if c.done() {
		return "", fmt.Errorf("expected %s, found end of line", what)
	}
	t := c.toks[c.pos]
	if !t.quoted && strings.ContainsAny(t.s, "{};,") {
		return "", fmt.Errorf("expected %s, found %q", what, t.s)
	}
	c.pos++
	return t.s, nil
}

// expect consumes one of the given words.
func (c *cursor) expect(words ...string) (string, error) {
	w, err := c.word(strings.Join(words, " or "))
	if err != nil {
		return "", err
	}
	for _, x := range words {
		if w == x {
			return w, nil
		}
	}
	return "", fmt.Errorf("expected %s, found %q", strings.Join(words, " or "), w)
}

// accept consumes the next word if it is w.
func (c *cursor) accept(w string) bool {
	if c.peek() == w {
		c.pos++
		return true
	}
	return false
}

func (c *cursor) end() error {
	if !c.done() {
		return fmt.Errorf("unexpected %q", c.toks[c.pos].s)
	}
	return nil
}
