package nft

import (
	"errors"
	"fmt"
	"strings"
)

// nested reads one table block in the form `nft list table|ruleset`
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
// Every object is added (as `nft -f` does with such a block): the table
// (with the comment of a comment line right after it), each chain once
// its declaration lines are read, then its rules, each set with its
// elements. It returns the index of the table's closing line.
func (r *reader) nested(start int) (int, error) {
	toks, _ := tokenize(strings.TrimSpace(r.lines[start])) // the caller tokenized this line already
	c := &cursor{toks: toks[1:]}
	fam, err := c.word("family")
	if err != nil {
		return start, r.fail(start, err)
	}
	f := Family(fam)
	if f != IPv4 && f != IPv6 {
		return start, r.fail(start, fmt.Errorf("unsupported family %q (only ip and ip6)", fam))
	}
	name, err := c.word("table name")
	if err != nil {
		return start, r.fail(start, err)
	}
	if _, err := c.expect("{"); err != nil {
		return start, r.fail(start, err)
	}
	if err := c.end(); err != nil {
		return start, r.fail(start, err)
	}
	// The table is added at its first line that is not its comment.
	tbl := &Parsed{Family: f, Table: name, Line: start + 1, Op: Op{Kind: OpAdd, Table: &Table{Family: f, Name: name}}}
	added := false
	addTable := func() error {
		if added {
			return nil
		}
		added = true
		return r.emit(tbl)
	}

	for i := start + 1; i < len(r.lines); i++ {
		toks, err := tokenize(strings.TrimSpace(r.lines[i]))
		if err != nil {
			return i, r.fail(i, err)
		}
		if len(toks) == 0 {
			continue
		}
		c := &cursor{toks: toks}
		w := c.peek()
		if w == "comment" {
			c.pos++
			s, err := c.quoted("comment")
			if err == nil {
				err = c.end()
			}
			if err != nil {
				return i, r.fail(i, err)
			}
			if added {
				// A comment after the table's objects: add it again.
				err = r.emit(&Parsed{Family: f, Table: name, Line: i + 1, Op: Op{Kind: OpAdd, Table: &Table{Family: f, Name: name, Comment: s}}})
				if err != nil {
					return i, err
				}
			}
			tbl.Op.Table.Comment = s
			continue
		}
		if err := addTable(); err != nil {
			return i, err
		}
		switch w {
		case "}":
			c.pos++
			if err := c.end(); err != nil {
				return i, r.fail(i, err)
			}
			return i, nil
		case "chain":
			end, err := r.nestedChain(f, name, i)
			if err != nil {
				return end, err
			}
			i = end
		case "set", "map":
			end, err := r.nestedSet(f, name, i, w == "map")
			if err != nil {
				return end, err
			}
			i = end
		default:
			return i, r.fail(i, fmt.Errorf("unexpected %q in a table block (want chain, set, map, comment or })", w))
		}
	}
	return start, r.fail(start, errors.New("table block is not closed"))
}

// nestedChain reads "chain NAME {" ... "}" starting at line start.
func (r *reader) nestedChain(f Family, table string, start int) (int, error) {
	toks, _ := tokenize(strings.TrimSpace(r.lines[start]))
	if len(toks) != 3 || toks[1].quoted || toks[2].s != "{" {
		return start, r.fail(start, errors.New(`expected "chain NAME {"`))
	}
	name := toks[1].s
	// Declaration lines (type/policy/comment) come first; the chain is
	// added at the first rule or at the closing brace.
	spec := []token{{s: name}, {s: "{"}}
	specLine := start
	created := false
	create := func() error {
		if created {
			return nil
		}
		created = true
		ops, err := r.op("add", "chain", f, table, &cursor{toks: append(spec, token{s: "}"})}, specLine+1)
		if err != nil {
			return r.fail(specLine, err)
		}
		return r.emit(ops...)
	}
	for i := start + 1; i < len(r.lines); i++ {
		toks, err := tokenize(strings.TrimSpace(r.lines[i]))
		if err != nil {
			return i, r.fail(i, err)
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
				return i, r.fail(i, fmt.Errorf("unexpected %q after }", toks[1].s))
			}
			if err := create(); err != nil {
				return specLine, err
			}
			return i, nil
		case !created && (first == "type" || first == "policy" || first == "comment"):
			spec = append(spec, toks...)
			spec = append(spec, token{s: ";"})
			specLine = i
		default:
			if err := create(); err != nil {
				return specLine, err
			}
			rule := append([]token{{s: name}}, toks...)
			ops, err := r.op("add", "rule", f, table, &cursor{toks: rule}, i+1)
			if err != nil {
				return i, r.fail(i, err)
			}
			if err := r.emit(ops...); err != nil {
				return i, err
			}
		}
	}
	return start, r.fail(start, errors.New("chain block is not closed"))
}

// nestedSet reads "set|map NAME {" ... "}" starting at line start. Its
// attributes are one a line; "elements = { ... }" may span lines.
func (r *reader) nestedSet(f Family, table string, start int, isMap bool) (int, error) {
	toks, _ := tokenize(strings.TrimSpace(r.lines[start]))
	if len(toks) != 3 || toks[1].quoted || toks[2].s != "{" {
		return start, r.fail(start, fmt.Errorf(`expected "%s NAME {"`, toks[0].s))
	}
	body := []token{toks[1], {s: "{"}}
	depth := 1 // braces open, counting the set's own
	for i := start + 1; i < len(r.lines); i++ {
		toks, err := tokenize(strings.TrimSpace(r.lines[i]))
		if err != nil {
			return i, r.fail(i, err)
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
			block := fmt.Sprintf("%s %s (lines %d-%d)", kind, body[0].s, start+1, i+1)
			ops, err := r.op("add", kind, f, table, &cursor{toks: body}, start+1)
			if err != nil {
				return start, r.fail(start, fmt.Errorf("%s: %w", block, err))
			}
			for _, p := range ops {
				p.Block = block
			}
			return i, r.emit(ops...)
		}
		// A line break at the set's own level ends an attribute.
		if depth == 1 && len(toks) > 0 {
			body = append(body, token{s: ";"})
		}
	}
	return start, r.fail(start, errors.New("set block is not closed"))
}
