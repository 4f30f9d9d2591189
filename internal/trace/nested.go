package trace

import "errors"

func (r *Ruleset) applyNested(lines []string, start int) (int, error) {
	return start, &ParseError{Line: start + 1, Text: lines[start], Err: errors.New("nested table form not supported yet")}
}
