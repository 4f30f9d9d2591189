package iptables

import (
	"bytes"

	"k8s.io/apimachinery/pkg/util/sets"
)

// builtinChains are the chains kproxy hooks into, by table.
var builtinChains = map[string][]string{
	tableFilter: {"INPUT", "FORWARD", "OUTPUT"},
	tableNAT:    {"PREROUTING", "OUTPUT", "POSTROUTING"},
}

// ParseExisting reads what a full sync needs of iptables-save output of
// the nat and filter tables: the chains of each, and the rules of the
// built-in chains kproxy hooks into. Only lines starting with ':' or "-A <built-in>"
// are looked at, so the cost is one scan of the text.
func ParseExisting(nat, filter []byte) *Existing {
	e := &Existing{Rules: map[string]sets.Set[string]{}}
	scan := func(table string, data []byte, chains *[]string) {
		rules := sets.New[string]()
		for line := range bytes.Lines(data) {
			line = bytes.TrimRight(line, " \r\n")
			switch {
			case len(line) > 1 && line[0] == ':':
				name := line[1:]
				if i := bytes.IndexByte(name, ' '); i >= 0 {
					name = name[:i]
				}
				*chains = append(*chains, string(name))
			case bytes.HasPrefix(line, []byte("-A ")):
				for _, c := range builtinChains[table] {
					if bytes.HasPrefix(line[3:], []byte(c)) && len(line) > 3+len(c) && line[3+len(c)] == ' ' {
						rules.Insert(string(line))
						break
					}
				}
			}
		}
		e.Rules[table] = rules
	}
	scan(tableNAT, nat, &e.NATChains)
	scan(tableFilter, filter, &e.FilterChains)
	return e
}
