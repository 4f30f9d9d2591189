package iptables

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/kproxy/kproxy/internal/proxy"
)

// Drift in iptables mode: kproxy keeps a count of the rules it wrote in
// each of its chains, followed through every restore it applied (a chain
// line ":C" creates or flushes C, "-A"/"-I" add, "-D" removes, "-F"
// flushes, "-X" deletes), and the jump rules from the built-in chains a
// full sync guarantees. Comparing that with iptables-save finds a chain
// deleted or flushed, a rule deleted or added, a jump removed, by
// whoever. Rule text is not compared: iptables-save prints matches in
// its own normal form (-m tcp, /32), so counts are what is exact. The
// canary chains (KUBE-PROXY-CANARY in mangle, nat and filter) are among
// the chains checked, as upstream's monitor checks them.
//
// The comparison runs at every full sync (on the iptables-save the sync
// reads anyway, before it rewrites everything) and, through
// proxy.Loop.CheckDrifts, on a bounded schedule between syncs.

// chainKey is a chain of a table.
type chainKey struct{ table, chain string }

// written is what kproxy's restores left in its chains.
type written struct {
	valid bool
	rules map[chainKey]int
	// jumps are the jump rules from built-in chains, by table, exactly
	// as iptables-save prints them.
	jumps map[string][]string
}

func newWritten() *written { return &written{rules: map[chainKey]int{}} }

// reset forgets everything: after a failed restore nothing is known.
func (w *written) reset() {
	w.valid = false
	clear(w.rules)
	w.jumps = nil
}

// follow applies one restore input (--noflush) to the model. Only chains
// named KUBE-* are followed; built-in chains hold others' rules too.
//
// A full sync at 10k services is 330k lines: a rule line costs no
// allocation (the rules of a chain come together, so the key of the line
// before is reused); a chain costs its name at its declaration and at its
// first rule.
func (w *written) follow(data []byte) {
	table := ""
	var last chainKey
	key := func(chain []byte) chainKey {
		if last.table != table || last.chain != string(chain) {
			last = chainKey{table, string(chain)}
		}
		return last
	}
	for line := range bytes.Lines(data) {
		line = bytes.TrimSuffix(line, []byte("\n"))
		if len(line) < 2 {
			continue
		}
		switch line[0] {
		case '*':
			table = string(line[1:])
			continue
		case ':':
			name, _, _ := bytes.Cut(line[1:], []byte(" "))
			if followed(name) {
				w.rules[key(name)] = 0
			}
			continue
		case '-':
		default:
			continue
		}
		op, rest, _ := bytes.Cut(line, []byte(" "))
		chain, _, _ := bytes.Cut(bytes.TrimLeft(rest, " "), []byte(" "))
		if len(chain) == 0 || !followed(chain) {
			continue
		}
		switch string(op) {
		case "-A", "-I":
			w.rules[key(chain)]++
		case "-D":
			w.rules[key(chain)]--
		case "-F":
			k := key(chain)
			if _, ok := w.rules[k]; ok {
				w.rules[k] = 0
			}
		case "-X":
			delete(w.rules, key(chain))
		}
	}
}

// followed reports whether kproxy alone writes a chain: a KUBE-* chain
// but those the kubelet writes too (its KUBE-FIREWALL copy may differ
// from ours; the hint is the kubelet's to keep).
func followed(chain []byte) bool {
	switch string(chain) {
	case chainKubeletFirewall, chainIPTablesHint, "KUBE-KUBELET-CANARY":
		return false
	}
	return bytes.HasPrefix(chain, []byte("KUBE-"))
}

// savedTable is what one table's iptables-save says about KUBE-* chains.
type savedTable struct {
	chains map[string]*int // rules per chain
	// lines are the rules of the chains kproxy does not follow (built-in
	// ones: its jumps are checked there, by their text).
	lines map[string]bool
}

// parseSavedTable reads iptables-save output. It runs every drift check,
// on tens of MB at 10k services: it keeps one string per chain and the
// text of the few rules in built-in chains, not a copy of every rule.
func parseSavedTable(data []byte) savedTable {
	s := savedTable{chains: map[string]*int{}, lines: map[string]bool{}}
	count := func(chain []byte) *int {
		n := s.chains[string(chain)] // no copy for a lookup
		if n == nil {
			n = new(int)
			s.chains[string(chain)] = n
		}
		return n
	}
	for line := range bytes.Lines(data) {
		line = bytes.TrimRight(line, " \r\n")
		switch {
		case len(line) > 1 && line[0] == ':':
			name, _, _ := bytes.Cut(line[1:], []byte(" "))
			count(name)
		case bytes.HasPrefix(line, []byte("-A ")):
			chain, _, _ := bytes.Cut(bytes.TrimLeft(line[3:], " "), []byte(" "))
			if len(chain) == 0 {
				continue
			}
			*count(chain)++
			if !followed(chain) {
				s.lines[string(line)] = true
			}
		}
	}
	return s
}

// diff compares the model with iptables-save output of some tables (a
// table not in saves is not compared).
func (w *written) diff(saves map[string][]byte) []proxy.Drift {
	return w.compare(parseSaves(saves))
}

// parseSaves parses iptables-save output of some tables, by table.
func parseSaves(saves map[string][]byte) map[string]savedTable {
	parsed := make(map[string]savedTable, len(saves))
	for t, data := range saves {
		parsed[t] = parseSavedTable(data)
	}
	return parsed
}

// compare compares the model with parsed iptables-save output of some
// tables (a table not in parsed is not compared).
func (w *written) compare(parsed map[string]savedTable) []proxy.Drift {
	if !w.valid {
		return nil
	}
	var out []proxy.Drift
	keys := make([]chainKey, 0, len(w.rules))
	for k := range w.rules {
		if _, ok := parsed[k.table]; ok {
			keys = append(keys, k)
		}
	}
	// In "table/chain" order, compared field by field: no table name is
	// a prefix of another. (Joining the two in the comparison cost a
	// string per comparison: 2M at 10k services.)
	slices.SortFunc(keys, func(a, b chainKey) int {
		return cmp.Or(strings.Compare(a.table, b.table), strings.Compare(a.chain, b.chain))
	})
	for _, k := range keys {
		want := w.rules[k]
		n, ok := parsed[k.table].chains[k.chain]
		have := 0
		if ok {
			have = *n
		}
		name := k.table + "/" + k.chain
		switch {
		case !ok:
			out = append(out, proxy.Drift{Kind: "chain", Name: name, Change: "deleted"})
		case have == 0 && want > 0:
			out = append(out, proxy.Drift{Kind: "chain", Name: name, Change: fmt.Sprintf("flushed (kproxy wrote %d rules)", want)})
		case have < want:
			out = append(out, proxy.Drift{Kind: "rule", Name: name, Change: fmt.Sprintf("%d deleted (has %d of kproxy's %d)", want-have, have, want)})
		case have > want:
			out = append(out, proxy.Drift{Kind: "rule", Name: name, Change: fmt.Sprintf("%d added (has %d, kproxy wrote %d)", have-want, have, want)})
		}
	}
	tables := make([]string, 0, len(w.jumps))
	for t := range w.jumps {
		tables = append(tables, t)
	}
	slices.Sort(tables)
	for _, t := range tables {
		p, ok := parsed[t]
		if !ok {
			continue
		}
		for _, j := range w.jumps[t] {
			if !p.lines[j] {
				chain, _, _ := strings.Cut(strings.TrimPrefix(j, "-A "), " ")
				target := j[strings.LastIndex(j, " ")+1:]
				out = append(out, proxy.Drift{Kind: "rule", Name: t + "/" + chain, Change: "jump to " + target + " deleted"})
			}
		}
	}
	return out
}

// driftTables are the tables the scheduled comparison reads.
var driftTables = []string{tableMangle, tableNAT, tableFilter}

// CheckDrift implements proxy.DriftChecker: it compares iptables-save of
// the mangle, nat and filter tables with what kproxy wrote. Before the
// first successful sync and after a failed one (the next sync is full
// then anyway) it reads nothing: proxy.ErrNothingToCompare.
//
// The tables are read and parsed without holding the lock that Sync
// takes: at 10k services iptables-save of the nat table takes a second or
// more, which a sync (an endpoint change just after the first sync, say)
// would otherwise wait out. A reading that a sync overlapped is thrown
// away: it may hold part of kproxy's own writing, which is no drift. The
// next check reads again.
func (p *Proxier) CheckDrift(ctx context.Context) ([]proxy.Drift, error) {
	p.mu.Lock()
	ready := p.cfg != nil && p.written.valid && !p.driftReported
	syncs := p.syncs
	p.mu.Unlock()
	if !ready {
		return nil, proxy.ErrNothingToCompare
	}
	saves := map[string][]byte{}
	for _, t := range driftTables {
		data, err := p.ipt.Save(ctx, t)
		if err != nil {
			return nil, err
		}
		saves[t] = data
	}
	parsed := parseSaves(saves)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.syncs != syncs || p.cfg == nil || !p.written.valid || p.driftReported {
		return nil, nil
	}
	ds := p.written.compare(parsed)
	for i := range ds {
		ds[i].Family = p.opts.Family
	}
	if len(ds) > 0 {
		// The repair's full sync would find the same; report once.
		p.driftReported = true
	}
	return ds, nil
}
