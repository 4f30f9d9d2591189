package xtables

import (
	"fmt"
	"strings"
)

// Token is one word of a line of iptables-restore input. Quoted says that
// it was written (at least in part) between double quotes: such a word is
// never taken for an option, a "!" or a rule number.
type Token struct {
	Text   string
	Quoted bool
}

// Tokenize splits a line of iptables-restore input as iptables-restore
// does: words are separated by blanks (spaces and tabs); a double quote
// opens a quoted part, which may hold blanks, in which a backslash takes
// the next character literally (iptables-save writes a quote in a comment
// as \" and a backslash as \\), and which the next unescaped double quote
// closes. Outside quotes a backslash is an ordinary character. `""` is an
// empty word. It is the one tokenizer of this syntax: the xtables fake and
// the iptables tracer read restore input with it, tests read saves with it
// (Fields).
func Tokenize(line string) ([]Token, error) {
	var (
		out     []Token
		b       strings.Builder
		inWord  bool
		quoted  bool // the current word has a quoted part
		inQuote bool
	)
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case inQuote && c == '\\' && i+1 < len(line):
			i++
			b.WriteByte(line[i])
		case inQuote && c == '"':
			inQuote = false
		case inQuote:
			b.WriteByte(c)
		case c == '"':
			inQuote, inWord, quoted = true, true, true
		case c == ' ' || c == '\t':
			if inWord {
				out = append(out, Token{Text: b.String(), Quoted: quoted})
				b.Reset()
				inWord, quoted = false, false
			}
		default:
			b.WriteByte(c)
			inWord = true
		}
	}
	if inQuote {
		return nil, fmt.Errorf("unterminated quoted string in %q", line)
	}
	if inWord {
		out = append(out, Token{Text: b.String(), Quoted: quoted})
	}
	return out, nil
}

// Fields is Tokenize without the quoted marks: the words of the line.
func Fields(line string) ([]string, error) {
	toks, err := Tokenize(line)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(toks))
	for i, t := range toks {
		out[i] = t.Text
	}
	return out, nil
}

// Quote writes one field so that Tokenize reads it back: as it is when it
// has no blank, quote or backslash (and is not empty), else in double
// quotes with \" and \\ escaped.
func Quote(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\"\\") {
		return s
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

// SaveString quotes a string argument (a comment) as iptables-save does
// (xtables_save_string): as it is only if it is made of letters, digits,
// '_' and '-', else in double quotes with \\, \" and \' escaped.
func SaveString(s string) string {
	plain := s != ""
	for _, c := range s {
		if !(c == '_' || c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			plain = false
			break
		}
	}
	if plain {
		return s
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, `'`, `\'`).Replace(s) + `"`
}
