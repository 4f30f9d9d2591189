package nftstate

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/nft/nfnetlink"
)

// ruleTargets lists the chains a rule jumps or goes to.
func ruleTargets(r nft.Rule) []string {
	chains, _ := nft.Refs(r.Stmts)
	return chains
}

// ruleSets lists the named sets a rule uses.
func ruleSets(r nft.Rule) []string {
	_, sets := nft.Refs(r.Stmts)
	return sets
}

func (x *Txn) checkJump(v nft.Verdict) error {
	switch v.Kind {
	case nft.Accept, nft.Drop, nft.Return:
		return nil
	case nft.Jump, nft.Goto:
		c := x.t.Chains[v.Chain]
		if c == nil {
			return kerr(unix.ENOENT, "%s to chain %q, which does not exist", v.Kind, v.Chain)
		}
		if c.Def.Hook != "" {
			return kerr(unix.EOPNOTSUPP, "%s to base chain %s", v.Kind, v.Chain)
		}
		return nil
	}
	return kerr(unix.EINVAL, "unknown verdict %q", v.Kind)
}

func (x *Txn) ruleOp(i int, p *nft.Parsed) error {
	r := p.Op.Rule
	c := x.t.Chains[r.Chain]
	if c == nil {
		return kerr(unix.ENOENT, "chain %s does not exist", r.Chain)
	}
	if p.Op.Kind == nft.OpDelete && p.ByHandle {
		for j, ru := range c.Rules {
			if ru.Handle == p.Handle {
				c.Rules = append(c.Rules[:j:j], c.Rules[j+1:]...)
				return nil
			}
		}
		return kerr(unix.ENOENT, "no rule with handle %d in chain %s", p.Handle, r.Chain)
	}
	if p.Op.Kind == nft.OpDelete && x.dialect == File {
		// text.go prints a rule deletion as the rule itself (the kernel
		// wants a handle): remove the first rule that reads the same.
		want := RuleText(x.t.Family, r.Stmts, r.Comment)
		for j, ru := range c.Rules {
			if RuleText(x.t.Family, ru.Stmts, ru.Comment) == want {
				c.Rules = append(c.Rules[:j:j], c.Rules[j+1:]...)
				return nil
			}
		}
		return kerr(unix.ENOENT, "no such rule in chain %s", r.Chain)
	}
	if p.Op.Kind != nft.OpAdd && p.Op.Kind != nft.OpInsert {
		return kerr(unix.EINVAL, "rules can only be added or inserted (flush or delete their chain instead)")
	}
	if x.dialect == Netlink {
		if err := x.checkRule(*r); err != nil {
			return err
		}
	}
	nr := *r
	nr.Stmts = slices.Clone(r.Stmts)
	x.added[x.t.NewRule(nr, p.Op.Kind == nft.OpInsert, p.Line, x.gen)] = i
	return nil
}

// checkRule checks a rule's statements against the current table.
func (x *Txn) checkRule(r nft.Rule) error {
	var l4 uint8
	for _, st := range r.Stmts {
		if err := x.checkStmt(st, &l4); err != nil {
			return err
		}
	}
	return nil
}

// RuleText is the body of a rule as text.go prints it (statements and
// comment): how a "delete rule" without a handle names its rule, and how
// the tracer shows one.
func RuleText(f nft.Family, stmts []nft.Stmt, comment string) string {
	tx := nft.NewTransaction(f, "t")
	tx.Add(&nft.Rule{Chain: "c", Stmts: stmts, Comment: comment})
	s := strings.TrimSuffix(tx.String(), "\n")
	return strings.TrimPrefix(strings.TrimPrefix(s, "add rule "+string(f)+" t c"), " ")
}

func (x *Txn) addrFamily(addr netip.Addr) error {
	if addr.Is4() != (x.t.Family == nft.IPv4) || addr.Is4In6() {
		return kerr(unix.EINVAL, "address %s does not belong to family %s", addr, x.t.Family)
	}
	return nil
}

func (x *Txn) checkStmt(st nft.Stmt, l4 *uint8) error {
	addrType := nft.AddrType(x.t.Family)
	switch s := st.(type) {
	case nft.MatchAddr:
		if s.Set != "" {
			set := x.t.Sets[s.Set]
			if set == nil {
				return kerr(unix.ENOENT, "set %s does not exist", s.Set)
			}
			// A lookup in a map matches its keys, which the kernel allows.
			if len(set.Def.Key) != 1 || set.Def.Key[0] != addrType {
				return kerr(unix.EINVAL, "set %s does not have %s keys", s.Set, addrType)
			}
			return nil
		}
		if len(s.Prefixes) == 0 {
			return kerr(unix.EINVAL, "address match without addresses")
		}
		for _, p := range s.Prefixes {
			if !p.IsValid() {
				return kerr(unix.EINVAL, "invalid prefix")
			}
			if err := x.addrFamily(p.Addr()); err != nil {
				return err
			}
		}
	case nft.MatchL4Proto:
		p, ok := nfnetlink.ProtoNumber(s.Proto)
		if !ok {
			return kerr(unix.EINVAL, "unknown protocol %q", s.Proto)
		}
		*l4 = p
	case nft.MatchDport:
		p, ok := nfnetlink.ProtoNumber(s.Proto)
		if !ok {
			return kerr(unix.EINVAL, "unknown protocol %q", s.Proto)
		}
		if *l4 != 0 && *l4 != p {
			return kerr(unix.EINVAL, "conflicting protocols specified")
		}
		*l4 = p
	case nft.MatchIifname:
		if s.Name == "" && s.Prefix {
			return kerr(unix.EINVAL, "all-wildcard strings are not supported")
		}
		if len(s.Name) >= 16 {
			return kerr(unix.EINVAL, "interface name %q is too long", s.Name)
		}
	case nft.DNAT:
		p, ok := nfnetlink.ProtoNumber(s.Proto)
		if !ok {
			return kerr(unix.EINVAL, "unknown protocol %q", s.Proto)
		}
		if !s.To.IsValid() {
			return kerr(unix.EINVAL, "invalid dnat destination")
		}
		if err := x.addrFamily(s.To.Addr()); err != nil {
			return err
		}
		*l4 = p
	case nft.DNATMap:
		p, ok := nfnetlink.ProtoNumber(s.Proto)
		if !ok {
			return kerr(unix.EINVAL, "unknown protocol %q", s.Proto)
		}
		if s.Mod == 0 || s.Offset+s.Mod < s.Offset {
			return kerr(unix.EINVAL, "numgen mod %d offset %d", s.Mod, s.Offset)
		}
		m := x.t.Sets[s.Map]
		if m == nil {
			return kerr(unix.ENOENT, "map %s does not exist", s.Map)
		}
		if m.Def.ByService {
			// The kernel refuses the lookup: numgen's 4 bytes are not
			// the map's key length.
			return kerr(unix.EINVAL, "%s is an endpoint map keyed by service", s.Map)
		}
		if m.Def.Endpoints == "" {
			// The kernel's lookup finds no data of the right kind
			// in a verdict map.
			if m.Def.Data == nft.TypeVerdict {
				return kerr(unix.ENODATA, "%s is a verdict map, not an endpoint map", s.Map)
			}
			return kerr(unix.EINVAL, "%s is not an endpoint map", s.Map)
		}
		// nft refuses a rule whose protocol differs from the map's
		// ("conflicting protocols specified").
		if m.Def.Endpoints != s.Proto {
			return kerr(unix.EINVAL, "map %s holds %s endpoints, the rule DNATs %s", s.Map, m.Def.Endpoints, s.Proto)
		}
		*l4 = p
	case nft.DNATByService:
		p, ok := nfnetlink.ProtoNumber(s.Proto)
		if !ok {
			return kerr(unix.EINVAL, "unknown protocol %q", s.Proto)
		}
		if s.Mod == 0 {
			return kerr(unix.EINVAL, "numgen mod 0")
		}
		m := x.t.Sets[s.Map]
		if m == nil {
			return kerr(unix.ENOENT, "map %s does not exist", s.Map)
		}
		// The kernel checks the key length of the concatenation, nft
		// the types and the protocol.
		if m.Def.Endpoints == "" || !m.Def.ByService {
			return kerr(unix.EINVAL, "%s is not an endpoint map keyed by service", s.Map)
		}
		if m.Def.Endpoints != s.Proto {
			return kerr(unix.EINVAL, "map %s holds %s endpoints, the rule DNATs %s", s.Map, m.Def.Endpoints, s.Proto)
		}
		*l4 = p
	case nft.UpdateSaddr:
		set := x.t.Sets[s.Set]
		if set == nil {
			return kerr(unix.ENOENT, "set %s does not exist", s.Set)
		}
		// The kernel accepts updates of a hash set without the dynamic
		// flag, but interval sets cannot be updated from the packet path.
		if set.Def.Interval {
			return kerr(unix.EOPNOTSUPP, "interval set %s cannot be updated from the packet path", s.Set)
		}
		if set.Def.IsMap() || len(set.Def.Key) != 1 || set.Def.Key[0] != addrType {
			return kerr(unix.EINVAL, "set %s is not a set of %s", s.Set, addrType)
		}
	case nft.MatchInSet:
		m := x.t.Sets[s.Set]
		if m == nil {
			return kerr(unix.ENOENT, "set %s does not exist", s.Set)
		}
		if m.Def.IsMap() {
			return kerr(unix.EINVAL, "%s is a map, not a set", s.Set)
		}
		var want []nft.DataType
		for _, f := range s.Fields {
			switch f {
			case nft.FieldDaddr, nft.FieldSaddr:
				want = append(want, addrType)
			case nft.FieldL4Proto:
				want = append(want, nft.TypeInetProto)
			case nft.FieldDport:
				want = append(want, nft.TypeInetService)
			default:
				return kerr(unix.EINVAL, "unknown field %q", f)
			}
		}
		if !slices.Equal(want, m.Def.Key) {
			return kerr(unix.EINVAL, "set %s has key %v, the lookup gives %v", s.Set, m.Def.Key, want)
		}
	case nft.VmapLookup:
		m := x.t.Sets[s.Map]
		if m == nil {
			return kerr(unix.ENOENT, "map %s does not exist", s.Map)
		}
		if m.Def.Data != nft.TypeVerdict {
			return kerr(unix.EINVAL, "%s is not a verdict map", s.Map)
		}
		var want []nft.DataType
		loaded := 0 // bytes the fields put into registers
		for _, f := range s.Fields {
			switch f {
			case nft.FieldDaddr, nft.FieldSaddr:
				want = append(want, addrType)
				loaded += addrLen(addrType)
			case nft.FieldL4Proto:
				want = append(want, nft.TypeInetProto)
				loaded += 4
			case nft.FieldDport:
				want = append(want, nft.TypeInetService)
				loaded += 4
			default:
				return kerr(unix.EINVAL, "unknown field %q", f)
			}
		}
		// The kernel refuses to read registers no expression wrote
		// (ENODATA); it does not check the types, the fake does.
		if loaded < keyLen(m.Def.Key) {
			return kerr(unix.ENODATA, "lookup in %s reads %d bytes of registers, only %d were loaded", s.Map, keyLen(m.Def.Key), loaded)
		}
		if !slices.Equal(want, m.Def.Key) {
			return kerr(unix.EINVAL, "map %s has key %v, the lookup gives %v", s.Map, m.Def.Key, want)
		}
	case nft.NumgenVmap:
		if len(s.Chains) == 0 {
			return kerr(unix.EINVAL, "numgen vmap without chains")
		}
		for _, c := range s.Chains {
			if err := x.checkJump(nft.Verdict{Kind: nft.Goto, Chain: c}); err != nil {
				return err
			}
		}
	case nft.MatchNumgen:
		// The kernel takes any modulus; kproxy's lowering refuses a value
		// that can never match, and so does the fake.
		if s.Mod == 0 || s.Value >= s.Mod {
			return kerr(unix.EINVAL, "numgen random mod %d %d can never match", s.Mod, s.Value)
		}
	case nft.Verdict:
		return x.checkJump(s)
	default:
		// Statements without checks of their own (ct state, fib, mark,
		// masquerade, reject, counter, and any new one): what the kernel
		// looks up when loading them is what they name.
		chains, sets := nft.Refs([]nft.Stmt{st})
		for _, c := range chains {
			if err := x.checkJump(nft.Verdict{Kind: nft.Goto, Chain: c}); err != nil {
				return err
			}
		}
		for _, n := range sets {
			if x.t.Sets[n] == nil {
				return kerr(unix.ENOENT, "set %s does not exist", n)
			}
		}
	}
	return nil
}

// NF_JUMP_STACK_SIZE: the kernel refuses deeper chain nesting.
const maxJumpDepth = 16

// Allowed hooks of statements the kernel validates per base chain
// (nft_*_validate in the kernel).
var stmtHooks = map[string]map[string]bool{
	"masquerade": {nft.HookPostrouting: true},
	"dnat":       {nft.HookPrerouting: true, nft.HookOutput: true},
	"reject":     {nft.HookPrerouting: true, nft.HookInput: true, nft.HookForward: true, nft.HookOutput: true},
}

// validate walks every chain reachable from a base chain, as the kernel
// does when it commits: loops, too deep nesting, and statements not
// allowed at the base chain's hook fail the transaction.
func (x *Txn) validate() error {
	x.sortedMaps = map[string][]*Element{}
	defer func() { x.sortedMaps = nil }()
	names := slices.Sorted(maps.Keys(x.t.Chains))
	for _, n := range names {
		base := x.t.Chains[n]
		if base.Def.Hook == "" {
			continue
		}
		if err := x.walk(base, base, nil); err != nil {
			return err
		}
	}
	return nil
}

func (x *Txn) walk(base, c *Chain, stack []string) error {
	stack = append(stack, c.Def.Name)
	if len(stack) > maxJumpDepth {
		return x.refuse(-1, kerr(unix.EMLINK, "chains nested too deep: %s", strings.Join(stack, " -> ")))
	}
	for _, r := range c.Rules {
		for _, st := range r.Rule.Stmts {
			what := ""
			switch st.(type) {
			case nft.Masquerade:
				what = "masquerade"
			case nft.DNAT, nft.DNATMap, nft.DNATByService:
				what = "dnat"
			case nft.Reject:
				what = "reject"
			}
			if what == "" {
				continue
			}
			ok := stmtHooks[what][base.Def.Hook]
			if what != "reject" && base.Def.Type != nft.TypeNAT {
				ok = false
			}
			if !ok {
				err := kerr(unix.EOPNOTSUPP, "%s in chain %s is reachable from base chain %s (%s hook %s)", what, c.Def.Name, base.Def.Name, base.Def.Type, base.Def.Hook)
				return x.refuseRule(r, err)
			}
		}
		for _, t := range ruleTargets(r.Rule) {
			if next := x.t.Chains[t]; next != nil {
				if slices.Contains(stack, t) {
					return x.refuseRule(r, loop(stack, t))
				}
				if err := x.walk(base, next, stack); err != nil {
					return err
				}
			}
		}
		for _, sn := range ruleSets(r.Rule) {
			s := x.t.Sets[sn]
			if s == nil || !s.Def.IsMap() {
				continue
			}
			for _, e := range x.jumpElems(sn, s) {
				v := e.Verdict
				if next := x.t.Chains[v.Chain]; next != nil {
					if slices.Contains(stack, v.Chain) {
						return x.refuseRule(r, loop(stack, v.Chain))
					}
					if err := x.walk(base, next, stack); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

// jumpElems is map s's elements whose verdict is a jump or a goto, in
// the order of their IDs, computed once per validate.
func (x *Txn) jumpElems(name string, s *Set) []*Element {
	if elems, ok := x.sortedMaps[name]; ok {
		return elems
	}
	var elems []*Element
	for _, e := range s.Elems {
		if v := e.Verdict; v != nil && (v.Kind == nft.Jump || v.Kind == nft.Goto) {
			elems = append(elems, e)
		}
	}
	// IDs are the packed keys themselves (elemkey.go): no allocation.
	slices.SortFunc(elems, func(a, b *Element) int { return strings.Compare(a.ID(), b.ID()) })
	if x.sortedMaps != nil {
		x.sortedMaps[name] = elems
	}
	return elems
}

// refuseRule reports a refusal found at commit in a rule: at the
// operation that added it, or (a rule of an earlier transaction) at the
// transaction.
func (x *Txn) refuseRule(r *Rule, err error) error {
	if i, ok := x.added[r]; ok {
		return x.refuse(i, err)
	}
	if x.dialect == File && r.Line > 0 {
		err = fmt.Errorf("%w (from line %d of an earlier text)", err, r.Line)
	}
	return x.refuse(-1, err)
}

// loop is the refusal of a jump back into the stack: the kernel finds
// loops by the nesting limit, EMLINK.
func loop(stack []string, to string) error {
	return kerr(unix.EMLINK, "chain loop: %s -> %s", strings.Join(stack, " -> "), to)
}
