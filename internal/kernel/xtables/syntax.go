package xtables

import (
	"fmt"
	"strings"
)

// Fields splits a line of iptables-restore input as iptables-restore does:
// on blanks, with double-quoted strings (where \" and \\ are escapes) kept
// whole and unquoted.
func Fields(line string) ([]string, error) {
	var out []string
	var b strings.Builder
	inTok, quoted := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quoted && c == '\\' && i+1 < len(line):
			i++
			b.WriteByte(line[i])
		case c == '"':
			quoted = !quoted
			inTok = true
		case !quoted && (c == ' ' || c == '\t'):
			if inTok {
				out = append(out, b.String())
				b.Reset()
				inTok = false
			}
		default:
			b.WriteByte(c)
			inTok = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("unterminated quote in %q", line)
	}
	if inTok {
		out = append(out, b.String())
	}
	return out, nil
}

// Quote writes one field so that Fields reads it back: as it is when it
// has no blank, quote or backslash (and is not empty), else in double
// quotes with \" and \\ escaped, as iptables-save prints comments.
func Quote(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\"\\") {
		return s
	}
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"` + r.Replace(s) + `"`
}

// JoinFields is the inverse of Fields: the fields quoted as needed and
// joined with single spaces.
func JoinFields(fields []string) string {
	var b strings.Builder
	for i, f := range fields {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(Quote(f))
	}
	return b.String()
}
