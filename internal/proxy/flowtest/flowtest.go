// Package flowtest holds the packet-flow expectations every proxy mode is
// tested against, in the style of upstream's runPacketFlowTests: one table
// (Scenarios) of cluster snapshots and the packets sent into them, each
// with where it must end (which endpoints it may be DNATed to, masqueraded
// or not, or dropped, rejected, or let through untouched). Where one mode
// differs, the case says so in Except, with the reason.
//
// A mode's test package runs the whole table through its own renderer and
// tracer with one function, its Adapter:
//
//	func TestPacketFlow(t *testing.T) { flowtest.Run(t, flowtest.NFTables, adapter) }
//
// so a case added here is checked in every mode. The package is imported
// by tests only; it must not import any mode's package (their internal
// tests import it).
package flowtest

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/trace"
)

// Mode names a proxy mode, the key of Case.Except.
type Mode string

// The modes, each with an adapter in its package (flow_test.go).
const (
	NFTables Mode = "nftables"
	IPTables Mode = "iptables"
	IPVS     Mode = "ipvs"
)

var knownModes = []Mode{NFTables, IPTables, IPVS}

// Tracer is a mode's rendered rules loaded into its tracer: it answers
// where a packet goes. *nftables.Ruleset of internal/trace/nftables is one; the iptables
// adapter dispatches to one iptables tracer per family.
type Tracer interface {
	// Trace follows the first packet of a new connection through the
	// rules of node h.
	Trace(p trace.Packet, h trace.Host) (*trace.Result, error)
	// Remember records an outcome's affinity updates, as the kernel does
	// once the connection is made, so that the client's next connection
	// sticks to the same endpoint.
	Remember(o trace.Outcome) error
}

// Adapter is all a mode provides to run the table: render a full sync of
// both families of s for a fresh node (no rules yet) with the mode's own
// renderer, and load the result into a fresh tracer. It maps every field
// of s.Config its mode has onto its own options; fields the mode does not
// have are ignored, and the cases that depend on them carry an exception
// for the mode. It fails t (t.Fatal) when the renderer reports a conflict
// or the tracer refuses the rules (the tracers refuse what the kernel
// would). Each call returns a new Tracer: Remember must not leak between
// calls.
type Adapter func(t testing.TB, s *Snapshot) Tracer

// Case is one packet and where it must end.
type Case struct {
	Name  string
	Proto v1.Protocol // TCP when empty
	Src   string
	// IIF is the input interface; "" for a packet sent by a process on
	// the node itself.
	IIF string
	Dst string // "ip:port", "[ip6]:port"
	// Output is where the packet ends in every mode without an exception:
	// the endpoints it may be DNATed to ("ip:port, ip:port", sorted as
	// addresses), or "DROP", "REJECT", or "ACCEPT" (let through unchanged:
	// not a service destination).
	Output string
	// Masq: the packet is masqueraded (source NAT to the node).
	Masq bool
	// Except holds the outcome of the modes that differ, each with why.
	Except map[Mode]Exception
	// KnownDiff, when set, names a known difference from upstream: the
	// case states upstream's outcome and is skipped (not failed) while
	// kproxy still differs, and fails once it no longer does, so that the
	// note gets removed.
	KnownDiff string
}

// Exception is a mode's own outcome for a Case.
type Exception struct {
	Output string
	Masq   bool
	// Why explains the difference (upstream's behaviour, a deliberate
	// choice): an exception without a reason fails the table.
	Why string
}

// Packet is the case's packet (source port 40000).
func (c Case) Packet() trace.Packet {
	d := netip.MustParseAddrPort(c.Dst)
	proto := c.Proto
	if proto == "" {
		proto = v1.ProtocolTCP
	}
	return trace.Packet{Src: netip.MustParseAddr(c.Src), SrcPort: 40000, Dst: d.Addr(), DstPort: d.Port(), Proto: proto, IIF: c.IIF}
}

// Want is the outcome the case expects in mode, and the exception's
// reason if the mode has one.
func (c Case) Want(mode Mode) (output string, masq bool, why string) {
	if e, ok := c.Except[mode]; ok {
		return e.Output, e.Masq, e.Why
	}
	return c.Output, c.Masq, ""
}

// check reports what is wrong with the case as written.
func (c Case) check() error {
	for m, e := range c.Except {
		if !slices.Contains(knownModes, m) {
			return fmt.Errorf("exception for unknown mode %q", m)
		}
		if strings.TrimSpace(e.Why) == "" {
			return fmt.Errorf("the %s exception gives no reason", m)
		}
		if e.Output == c.Output && e.Masq == c.Masq {
			return fmt.Errorf("the %s exception is the outcome of every mode: drop it", m)
		}
	}
	return nil
}

// Summary reduces a trace result to (output, masq) as a Case states them.
// Every outcome must agree on the verdict kind and on masquerading,
// otherwise problem says why: the checks that want per-endpoint
// differences (hairpin) look at the outcomes themselves.
func Summary(res *trace.Result) (output string, masq bool, problem string) {
	if len(res.Outcomes) == 0 {
		return "", false, "no outcome"
	}
	first := res.Outcomes[0]
	for _, o := range res.Outcomes[1:] {
		if o.Verdict != first.Verdict || (o.DNAT == nil) != (first.DNAT == nil) {
			return "", false, "outcomes disagree on the verdict"
		}
		if o.Masquerade != first.Masquerade {
			return "", false, "outcomes disagree on masquerading"
		}
	}
	switch {
	case first.Verdict == trace.VerdictDrop:
		return "DROP", false, ""
	case first.Verdict == trace.VerdictReject:
		return "REJECT", false, ""
	case first.DNAT == nil:
		return "ACCEPT", first.Masquerade, ""
	}
	var eps []string
	for _, e := range res.Endpoints() {
		eps = append(eps, e.String())
	}
	return strings.Join(eps, ", "), first.Masquerade, ""
}

// Check traces every case through tr, one subtest each, and compares
// with what the case wants in mode.
func Check(t *testing.T, mode Mode, tr Tracer, host trace.Host, cases []Case) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			if err := tc.check(); err != nil {
				t.Fatalf("the case is wrong: %v", err)
			}
			res, err := tr.Trace(tc.Packet(), host)
			if err != nil {
				t.Fatalf("trace: %v", err)
			}
			out, masq, problem := Summary(res)
			if problem != "" {
				t.Fatalf("%s:\n%s", problem, res)
			}
			wantOut, wantMasq, why := tc.Want(mode)
			if tc.KnownDiff != "" {
				if out == wantOut && masq == wantMasq {
					t.Errorf("%s now behaves as upstream; remove the KnownDiff note %q", res.Packet, tc.KnownDiff)
				} else {
					t.Skipf("known difference from upstream: %s (kproxy: %q masquerade=%v; upstream: %q masquerade=%v)", tc.KnownDiff, out, masq, wantOut, wantMasq)
				}
				return
			}
			if out != wantOut || masq != wantMasq {
				if why != "" {
					why = " (" + string(mode) + " exception: " + why + ")"
				}
				t.Errorf("%s: got %q masquerade=%v, want %q masquerade=%v%s\n%s", res.Packet, out, masq, wantOut, wantMasq, why, res)
			}
		})
	}
}

// Run runs the whole table, and the checks that look at single outcomes
// (hairpin, affinity, equal shares), against mode through load.
func Run(t *testing.T, mode Mode, load Adapter) {
	t.Helper()
	for _, sc := range Scenarios {
		t.Run(sc.Name, func(t *testing.T) {
			s := sc.Snapshot(t)
			Check(t, mode, load(t, s), s.Host(), sc.Cases)
		})
	}
	t.Run("hairpin", func(t *testing.T) { checkHairpin(t, load) })
	t.Run("affinity", func(t *testing.T) { checkAffinity(t, load) })
	t.Run("equal shares", func(t *testing.T) { checkEqualShares(t, load) })
}
