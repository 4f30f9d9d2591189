package trace

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

// applyNested applies one table block in the form `nft list table|ruleset`
// prints, which is also valid `nft -f` input:
//
//	table ip kube-proxy {
//		comment "rules for kube-proxy"
//		map service-ips {
//			type ipv4_addr . inet_proto . inet_service : verdict
//			elements = { 10.96.0.10 . tcp . 80 : goto service-X,
//				     10.96.0.11 . udp . 53 : goto service-Y }
//		}
//		chain nat-prerouting {
//			type nat hook prerouting priority dstnat; policy accept;
//			jump services
//		}
//	}
//
// Every object is added (as `nft -f` does with such a block). Chains may be
// referenced before their block: references are checked when the whole
// text has been applied. It returns the index of the table's closing line.
func (r *Ruleset) applyNested(lines []string, start int) (int, error) {
	raw := strings.TrimSpace(lines[start])
	fail := func(i int, err error) (int, error) {
		return i, &ParseError{Line: i + 1, Text: strings.TrimSpace(lines[i]), Err: err}
	}
	toks, _ := tokenize(raw) // the caller tokenized this line already
	c := &cursor{toks: toks[1:]}
	fam, err := c.word("family")
	if err != nil {
		return fail(start, err)
	}
	f := nft.Family(fam)
	if f != nft.IPv4 && f != nft.IPv6 {
		return fail(start, fmt.Errorf("unsupported family %q (only ip and ip6)", fam))
	}
	name, err := c.word("table name")
	if err != nil {
		return fail(start, err)
	}
	if _, err := c.expect("{"); err != nil {
		return fail(start, err)
	}
	if err := c.end(); err != nil {
		return fail(start, err)
	}
	if err := r.tableOp("add", f, name, r.table(f, name), &cursor{}); err != nil {
		return fail(start, err)
	}
	t := r.table(f, name)

	for i := start + 1; i < len(lines); i++ {
		toks, err := tokenize(strings.TrimSpace(lines[i]))
		if err != nil {
			return fail(i, err)
		}
		if len(toks) == 0 {
			continue
		}
		c := &cursor{toks: toks}
		switch w := c.peek(); w {
		case "}":
			c.pos++
			if err := c.end(); err != nil {
				return fail(i, err)
			}
			return i, nil
		case "comment":
			c.pos++
			s, err := c.quoted("comment")
			if err == nil {
				err = c.end()
			}
			if err != nil {
				return fail(i, err)
			}
			t.comment = s
		case "chain":
			end, err := t.nestedChain(lines, i)
			if err != nil {
				return end, err
			}
			i = end
		case "set", "map":
			end, err := t.nestedSet(lines, i, w == "map")
			if err != nil {
				return end, err
			}
			i = end
		default:
			return fail(i, fmt.Errorf("unexpected %q in a table block (want chain, set, map, comment or })", w))
		}
	}
	return fail(start, errors.New("table block is not closed"))
}

// nestedChain applies "chain NAME {" ... "}" starting at line start.
func (t *table) nestedChain(lines []string, start int) (int, error) {
	fail := func(i int, err error) (int, error) {
		return i, &ParseError{Line: i + 1, Text: strings.TrimSpace(lines[i]), Err: err}
	}
	toks, _ := tokenize(strings.TrimSpace(lines[start]))
	if len(toks) != 3 || toks[1].quoted || toks[2].s != "{" {
		return fail(start, errors.New(`expected "chain NAME {"`))
	}
	name := toks[1].s
	// Declaration lines (type/policy/comment) come first; the chain is
	// created at the first rule or at the closing brace.
	spec := []token{{s: name}, {s: "{"}}
	specLine := start
	created := false
	create := func() error {
		if created {
			return nil
		}
		created = true
		return t.chainOp("add", &cursor{toks: append(spec, token{s: "}"})}, specLine+1)
	}
	for i := start + 1; i < len(lines); i++ {
		raw := strings.TrimSpace(lines[i])
		toks, err := tokenize(raw)
		if err != nil {
			return fail(i, err)
		}
		if len(toks) == 0 {
			continue
		}
		first := ""
		if !toks[0].quoted {
			first = toks[0].s
		}
		switch {
		case first == "}":
			if len(toks) != 1 {
				return fail(i, fmt.Errorf("unexpected %q after }", toks[1].s))
			}
			if err := create(); err != nil {
				return fail(specLine, err)
			}
			return i, nil
		case !created && (first == "type" || first == "policy" || first == "comment"):
			spec = append(spec, toks...)
			spec = append(spec, token{s: ";"})
			specLine = i
		default:
			if err := create(); err != nil {
				return fail(specLine, err)
			}
			rule := append([]token{{s: name}}, toks...)
			if err := t.ruleOp("add", &cursor{toks: rule}, i+1); err != nil {
				return fail(i, err)
			}
		}
	}
	return fail(start, errors.New("chain block is not closed"))
}

// nestedSet applies "set|map NAME {" ... "}" starting at line start. Its
// attributes are one a line; "elements = { ... }" may span lines.
func (t *table) nestedSet(lines []string, start int, isMap bool) (int, error) {
	fail := func(i int, err error) (int, error) {
		return i, &ParseError{Line: i + 1, Text: strings.TrimSpace(lines[i]), Err: err}
	}
	toks, _ := tokenize(strings.TrimSpace(lines[start]))
	if len(toks) != 3 || toks[1].quoted || toks[2].s != "{" {
		return fail(start, fmt.Errorf(`expected "%s NAME {"`, toks[0].s))
	}
	body := []token{toks[1], {s: "{"}}
	depth := 1 // braces open, counting the set's own
	for i := start + 1; i < len(lines); i++ {
		toks, err := tokenize(strings.TrimSpace(lines[i]))
		if err != nil {
			return fail(i, err)
		}
		for _, tk := range toks {
			if !tk.quoted {
				switch tk.s {
				case "{":
					depth++
				case "}":
					depth--
				}
			}
			body = append(body, tk)
		}
		if depth == 0 {
			kind := "set"
			if isMap {
				kind = "map"
			}
			if err := t.setOp("add", isMap, &cursor{toks: body}, start+1); err != nil {
				return fail(start, fmt.Errorf("%s %s (lines %d-%d): %w", kind, body[0].s, start+1, i+1, err))
			}
			return i, nil
		}
		// A line break at the set's own level ends an attribute.
		if depth == 1 && len(toks) > 0 {
			body = append(body, token{s: ";"})
		}
	}
	return fail(start, errors.New("set block is not closed"))
}
