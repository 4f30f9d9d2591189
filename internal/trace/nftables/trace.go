package nftables

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/nft/nftstate"
	"github.com/kproxy/kproxy/internal/trace"
)

// Bounds of one walk. The kernel itself refuses rulesets that loop or jump
// deeper than 16 chains when they are loaded; a ruleset given as text was
// never checked by a kernel, so the tracer needs its own guard.
const (
	// MaxRuleEvaluations is the most rules one outcome's path may evaluate.
	MaxRuleEvaluations = 1000
	// MaxJumpDepth is the deepest jump stack allowed.
	MaxJumpDepth = 64
	// MaxOutcomes is the most outcomes one trace may produce (numgen
	// branches multiply).
	MaxOutcomes = 10000
)

// Remember applies an outcome's affinity updates to the ruleset, so that a
// following trace from the same source sticks to the same endpoint, as the
// kernel's dynamic sets make it (until their timeout, which the tracer does
// not model).
func (r *Ruleset) Remember(o trace.Outcome) error {
	return r.Apply(strings.Join(o.AffinityUpdates, "\n"))
}

// baseRef is a base chain with its table.
type baseRef struct {
	t *table
	c *chain
}

type frame struct {
	c   *chain
	pos int
}

// state is one path of the walk, resumable: numgen clones it per branch.
type state struct {
	pkt  trace.Packet // current header: the destination changes with DNAT
	mark uint32
	dnat *netip.AddrPort
	masq bool
	prob float64
	trace.Record
	evals int

	hook  string
	bases []baseRef
	bi    int
	stack []frame
	// The kernel sets up one NAT binding per direction and connection:
	// once a nat chain has done DNAT (or masquerade), the remaining nat
	// chains of that hook are not evaluated.
	dstNATDone, srcNATDone bool

	// The service port the walk is in (see service.go): svc from the
	// element that sent the packet to the chain at stack index svcDepth,
	// until that chain is left; ruleSvc for the steps of the rule being
	// evaluated only.
	svc, ruleSvc string
	svcDepth     int
}

func (s *state) clone() *state {
	n := *s
	n.Record = s.Record.Clone()
	n.stack = slices.Clone(s.stack)
	return &n
}

type walker struct {
	r    *Ruleset
	h    trace.Host
	fam  nft.Family
	res  *trace.Result
	base map[string][]baseRef // hook → base chains by priority
}

// Trace walks the first packet of a new connection through the ruleset,
// hook by hook in kernel order, and returns every possible outcome.
//
// A packet with an input interface goes prerouting, then (routing on the
// destination as DNAT left it) input if the destination is local, else
// forward and postrouting. A locally generated packet goes output, then
// postrouting. On each hook the base chains of all tables of the packet's
// family run in priority order.
func (r *Ruleset) Trace(p trace.Packet, h trace.Host) (*trace.Result, error) {
	if err := p.Check(); err != nil {
		return nil, err
	}
	if p.Family == 0 {
		p.Family = 4
		if p.Dst.Is6() {
			p.Family = 6
		}
	}
	w := &walker{r: r, h: h, fam: nft.IPv4, res: &trace.Result{Packet: p}, base: map[string][]baseRef{}}
	if p.Family == 6 {
		w.fam = nft.IPv6
	}
	for _, t := range r.state.Tables {
		if t.Family != w.fam {
			continue
		}
		for _, cn := range t.ChainOrder {
			if c := t.Chains[cn]; c.Base() {
				w.base[c.Def.Hook] = append(w.base[c.Def.Hook], baseRef{t, c})
			}
		}
	}
	for _, refs := range w.base {
		// Stable: equal priorities keep table and creation order.
		slices.SortStableFunc(refs, func(a, b baseRef) int { return cmp.Compare(a.c.Def.Priority, b.c.Def.Priority) })
	}
	s := &state{pkt: p, mark: p.Mark, prob: 1}
	if err := w.run(s); err != nil {
		return nil, err
	}
	return w.res, nil
}

// nextHook moves the state to the next hook; false when the packet has
// left the hooks (delivered locally or sent out).
func (w *walker) nextHook(s *state) bool {
	next := ""
	switch s.hook {
	case "":
		next = nft.HookOutput
		if s.pkt.IIF != "" {
			next = nft.HookPrerouting
		}
	case nft.HookPrerouting:
		if w.h.IsLocal(s.pkt.Dst) {
			s.Step("route: %s is local -> input", s.pkt.Dst)
			next = nft.HookInput
		} else {
			s.Step("route: %s is not local -> forward", s.pkt.Dst)
			next = nft.HookForward
		}
	case nft.HookForward:
		next = nft.HookPostrouting
	case nft.HookOutput:
		s.Step("route: to %s", s.pkt.Dst)
		next = nft.HookPostrouting
	default: // input, postrouting
		return false
	}
	s.hook, s.bases, s.bi = next, w.base[next], 0
	s.Step("hook %s", next)
	return true
}

// finish records an outcome.
func (w *walker) finish(s *state, verdict string) error {
	if len(w.res.Outcomes) >= MaxOutcomes {
		return fmt.Errorf("%w: more than %d outcomes", trace.ErrLimit, MaxOutcomes)
	}
	w.res.Outcomes = append(w.res.Outcomes, trace.Outcome{
		Verdict: verdict, DNAT: s.dnat, Masquerade: s.masq, Mark: s.mark,
		Probability: s.prob, Path: s.Path, AffinityUpdates: s.Updates,
	})
	return nil
}

// run walks one path to its end; numgen forks it.
func (w *walker) run(s *state) error {
	for {
		if len(s.stack) == 0 {
			// Between base chains: enter the next one, or the next hook.
			if s.bi >= len(s.bases) {
				if !w.nextHook(s) {
					return w.finish(s, trace.VerdictAccept)
				}
				continue
			}
			b := s.bases[s.bi]
			if b.c.Def.Type == nft.TypeNAT && w.natDone(s) {
				s.Step("%s: skipped, NAT already set up for this connection", b.c.Def.Name)
				s.bi++
				continue
			}
			s.Step("%s %s %s (%s, priority %d)", b.t.Family, b.t.Name, b.c.Def.Name, b.c.Def.Type, b.c.Def.Priority)
			s.stack = append(s.stack, frame{c: b.c})
			continue
		}
		top := &s.stack[len(s.stack)-1]
		if top.pos >= len(top.c.Rules) {
			s.ruleSvc = ""
			if done, err := w.pop(s, top.c.Def.Name+": end"); err != nil || done {
				return err
			}
			continue
		}
		c := top.c
		ru := c.Rules[top.pos]
		top.pos++
		s.evals++
		if s.evals > MaxRuleEvaluations {
			return fmt.Errorf("%w: more than %d rule evaluations (at chain %s); the ruleset loops", trace.ErrLimit, MaxRuleEvaluations, c.Def.Name)
		}
		done, err := w.evalRule(s, c, ru)
		if err != nil || done {
			return err
		}
	}
}

func (w *walker) natDone(s *state) bool {
	if s.hook == nft.HookPrerouting || s.hook == nft.HookOutput {
		return s.dstNATDone
	}
	return s.srcNATDone
}

// evalRule evaluates one rule; done means the path ended (an outcome was
// recorded or numgen forked the walk).
func (w *walker) evalRule(s *state, c *chain, ru *rule) (done bool, err error) {
	b := s.bases[s.bi]
	t := b.t
	text := func() string { return nftstate.RuleText(t.Family, ru.Stmts, ru.Comment) }
	s.ruleSvc = ""
	for _, st := range ru.Stmts {
		switch st := st.(type) {
		case nft.MatchCtStateNew:
			// Every traced packet opens a new connection.
		case nft.MatchAddr:
			if !w.matchAddr(s, t, st) {
				return false, nil
			}
		case nft.MatchL4Proto:
			if s.pkt.Proto != st.Proto {
				return false, nil
			}
		case nft.MatchDport:
			if s.pkt.Proto != st.Proto || s.pkt.DstPort != st.Port {
				return false, nil
			}
		case nft.MatchFibLocal:
			a := s.pkt.Dst
			if st.Source {
				a = s.pkt.Src
			}
			if !w.h.IsLocal(a) {
				return false, nil
			}
		case nft.MatchIifname:
			// Locally generated packets have no input interface: the
			// kernel compares against the empty name.
			var m bool
			if st.Prefix {
				m = strings.HasPrefix(s.pkt.IIF, st.Name)
			} else {
				m = s.pkt.IIF == st.Name
			}
			if m == st.Negate {
				return false, nil
			}
		case nft.MatchMarkZero:
			if s.mark&st.Mask != 0 {
				return false, nil
			}
		case nft.SetMarkOr:
			s.mark |= st.Mask
		case nft.SetMarkXor:
			s.mark ^= st.Mask
		case nft.Counter:
		case nft.UpdateSaddr:
			u := fmt.Sprintf("add element %s %s %s { %s }", t.Family, t.Name, st.Set, s.pkt.Src)
			s.Updates = append(s.Updates, u)
		case nft.Masquerade:
			s.masq, s.srcNATDone = true, true
			// NAT statements end the base chain with accept.
			s.Step("%s: %s -> masquerade, accept", c.Def.Name, text())
			return w.endBase(s)
		case nft.DNAT:
			if s.pkt.Proto != st.Proto {
				return false, nil
			}
			to := st.To
			s.dnat, s.dstNATDone = &to, true
			s.pkt.Dst, s.pkt.DstPort = to.Addr(), to.Port()
			s.Step("%s: %s -> dnat to %s, accept", c.Def.Name, text(), to)
			return w.endBase(s)
		case nft.DNATMap:
			if s.pkt.Proto != st.Proto {
				return false, nil
			}
			// Fork: numgen draws OFFSET+i with probability 1/MOD each;
			// the map gives the destination. A key the map does not
			// hold fails the rule (the walk goes on with the next one).
			m := t.Sets[st.Map]
			n := float64(st.Mod)
			for i := range st.Mod {
				br := s.clone()
				br.prob = s.prob / n
				k := st.Offset + i
				me := m.Get(nftstate.EndpointID(nil, k))
				if me == nil {
					br.Step("%s: %s -> %d (p=1/%d): not in the map", c.Def.Name, text(), k, st.Mod)
				} else {
					to := me.To()
					br.dnat, br.dstNATDone = &to, true
					br.pkt.Dst, br.pkt.DstPort = to.Addr(), to.Port()
					br.Step("%s: %s -> %d (p=1/%d): dnat to %s, accept", c.Def.Name, text(), k, st.Mod, to)
					if _, err := w.endBase(br); err != nil {
						return true, err
					}
				}
				if err := w.run(br); err != nil {
					return true, err
				}
			}
			return true, nil
		case nft.DNATByService:
			if s.pkt.Proto != st.Proto {
				return false, nil
			}
			// Fork as for DNATMap; the key is the packet's destination
			// address and port with numgen's value.
			// The draws the map lacks fail the rule alike: one branch
			// of their summed probability goes on with the next rule
			// (a later rule drawing again forks it once more).
			m := t.Sets[st.Map]
			svc := []nft.Value{{Addr: s.pkt.Dst}, {Port: s.pkt.DstPort}}
			n := float64(st.Mod)
			var missing []string
			for i := range st.Mod {
				me := m.Get(nftstate.EndpointID(svc, i))
				if me == nil {
					missing = append(missing, strconv.FormatUint(uint64(i), 10))
					continue
				}
				br := s.clone()
				br.prob = s.prob / n
				to := me.To()
				br.dnat, br.dstNATDone = &to, true
				br.pkt.Dst, br.pkt.DstPort = to.Addr(), to.Port()
				br.Step("%s: %s -> %s . %d (p=1/%d): dnat to %s, accept", c.Def.Name, text(), nftstate.KeyText(svc), i, st.Mod, to)
				if _, err := w.endBase(br); err != nil {
					return true, err
				}
				if err := w.run(br); err != nil {
					return true, err
				}
			}
			if len(missing) == 0 {
				return true, nil
			}
			s.prob = s.prob * float64(len(missing)) / n
			s.Step("%s: %s -> %s . {%s} (p=%d/%d): not in the map", c.Def.Name, text(), nftstate.KeyText(svc), strings.Join(missing, ","), len(missing), st.Mod)
			return false, nil
		case nft.Reject:
			s.Step("%s: %s -> reject", c.Def.Name, text())
			return true, w.finish(s, trace.VerdictReject)
		case nft.Verdict:
			if st.Kind == nft.Return {
				return w.pop(s, c.Def.Name+": "+text())
			}
			s.Step("%s: %s", c.Def.Name, text())
			return w.verdict(s, t, st)
		case nft.VmapLookup:
			m := t.Sets[st.Map]
			e := m.Lookup(w.keyOf(s, st.Fields))
			if e == nil {
				// A map miss ends the rule like a failed match.
				return false, nil
			}
			s.ruleElement(e)
			v := *e.Verdict
			if v.Kind == nft.Return {
				return w.pop(s, c.Def.Name+": "+text()+" -> return")
			}
			s.Step("%s: %s -> %s", c.Def.Name, text(), verdictString(v))
			return w.verdict(s, t, v)
		case nft.MatchInSet:
			e := t.Sets[st.Set].Lookup(w.keyOf(s, st.Fields))
			if e == nil {
				return false, nil
			}
			if slices.Contains(st.Fields, nft.FieldDport) {
				s.ruleElement(e)
			}
		case nft.MatchNumgen:
			// Fork: the rule fails for (MOD-1)/MOD of packets (the walk
			// goes on with the next rule), and goes on matching for 1/MOD.
			n := float64(st.Mod)
			if st.Mod > 1 {
				br := s.clone()
				br.prob = s.prob * (n - 1) / n
				br.Step("%s: numgen random mod %d != %d (p=%d/%d)", c.Def.Name, st.Mod, st.Value, st.Mod-1, st.Mod)
				if err := w.run(br); err != nil {
					return true, err
				}
			}
			s.prob /= n
			s.Step("%s: numgen random mod %d == %d (p=1/%d)", c.Def.Name, st.Mod, st.Value, st.Mod)
		case nft.NumgenVmap:
			n := len(st.Chains)
			for i, target := range st.Chains {
				br := s.clone()
				br.prob = s.prob / float64(n)
				br.Step("%s: numgen random mod %d -> %d: goto %s (p=1/%d)", c.Def.Name, n, i, target, n)
				if _, err := w.verdict(br, t, nft.Verdict{Kind: nft.Goto, Chain: target}); err != nil {
					return true, err
				}
				if err := w.run(br); err != nil {
					return true, err
				}
			}
			return true, nil
		default:
			return true, fmt.Errorf("chain %s: statement %T not supported by the tracer", c.Def.Name, st)
		}
	}
	// Matched, no verdict: note it when it did something visible.
	for _, st := range ru.Stmts {
		switch st.(type) {
		case nft.SetMarkOr, nft.SetMarkXor, nft.UpdateSaddr, nft.Counter:
			s.Step("%s: %s", c.Def.Name, text())
			return false, nil
		}
	}
	return false, nil
}

// endBase ends the current base chain with accept: the next base chain on
// the hook still runs.
func (w *walker) endBase(s *state) (bool, error) {
	s.stack = s.stack[:0]
	s.bi++
	s.leaveService()
	return false, nil
}

func (w *walker) verdict(s *state, t *table, v nft.Verdict) (bool, error) {
	switch v.Kind {
	case nft.Accept:
		return w.endBase(s)
	case nft.Drop:
		return true, w.finish(s, trace.VerdictDrop)
	case nft.Return:
		return w.pop(s, "return")
	case nft.Jump, nft.Goto:
		target := t.Chains[v.Chain]
		if target == nil {
			return true, fmt.Errorf("no chain %q in table %s %s", v.Chain, t.Family, t.Name)
		}
		if v.Kind == nft.Goto {
			s.stack[len(s.stack)-1] = frame{c: target}
			s.enterService()
			return false, nil
		}
		if len(s.stack) >= MaxJumpDepth {
			return true, fmt.Errorf("%w: jump depth above %d (at chain %s)", trace.ErrLimit, MaxJumpDepth, v.Chain)
		}
		s.stack = append(s.stack, frame{c: target})
		s.enterService()
		return false, nil
	}
	return true, fmt.Errorf("unknown verdict %q", v.Kind)
}

// pop leaves the current chain (its end or a return): back to the caller,
// or, when the stack runs out, the base chain's policy. After a goto the
// goto'd chain replaced its caller's frame, so it returns one level up.
func (w *walker) pop(s *state, why string) (bool, error) {
	s.stack = s.stack[:len(s.stack)-1]
	s.popService()
	defer func() { s.ruleSvc = "" }()
	if len(s.stack) > 0 {
		s.Step("%s, back to %s", why, s.stack[len(s.stack)-1].c.Def.Name)
		return false, nil
	}
	b := s.bases[s.bi]
	if b.c.Policy == nft.Drop {
		s.Step("%s, policy drop", why)
		return true, w.finish(s, trace.VerdictDrop)
	}
	s.Step("%s, policy accept", why)
	s.bi++
	return false, nil
}

func verdictString(v nft.Verdict) string {
	if v.Chain != "" {
		return string(v.Kind) + " " + v.Chain
	}
	return string(v.Kind)
}

func (w *walker) keyOf(s *state, fields []nft.Field) []nft.Value {
	vals := make([]nft.Value, len(fields))
	for i, f := range fields {
		switch f {
		case nft.FieldDaddr:
			vals[i] = nft.Value{Addr: s.pkt.Dst}
		case nft.FieldSaddr:
			vals[i] = nft.Value{Addr: s.pkt.Src}
		case nft.FieldL4Proto:
			vals[i] = nft.Value{Proto: s.pkt.Proto}
		case nft.FieldDport:
			vals[i] = nft.Value{Port: s.pkt.DstPort}
		}
	}
	return vals
}

func (w *walker) matchAddr(s *state, t *table, m nft.MatchAddr) bool {
	a := s.pkt.Dst
	if m.Source {
		a = s.pkt.Src
	}
	var in bool
	if m.Set != "" {
		in = t.Sets[m.Set].Lookup([]nft.Value{{Addr: a}}) != nil
	} else {
		for _, p := range m.Prefixes {
			if p.Contains(a) {
				in = true
				break
			}
		}
	}
	return in != m.Negate
}
