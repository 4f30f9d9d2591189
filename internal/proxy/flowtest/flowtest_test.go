package flowtest

import (
	"net/netip"
	"testing"

	"github.com/kproxy/kproxy/internal/trace"
)

// TestTable checks the table as written, without any mode: unique names
// (go test would rename duplicates silently), packets that parse, and
// exceptions with a reason that differ from the common outcome.
func TestTable(t *testing.T) {
	scenarios := map[string]bool{}
	for _, sc := range Scenarios {
		if scenarios[sc.Name] {
			t.Errorf("scenario %q twice", sc.Name)
		}
		scenarios[sc.Name] = true
		if len(sc.Cases) == 0 {
			t.Errorf("scenario %q has no cases", sc.Name)
		}
		names := map[string]bool{}
		for _, c := range sc.Cases {
			if names[c.Name] {
				t.Errorf("%s: case %q twice", sc.Name, c.Name)
			}
			names[c.Name] = true
			if err := c.check(); err != nil {
				t.Errorf("%s/%s: %v", sc.Name, c.Name, err)
			}
			if _, err := netip.ParseAddr(c.Src); err != nil {
				t.Errorf("%s/%s: source: %v", sc.Name, c.Name, err)
			}
			if _, err := netip.ParseAddrPort(c.Dst); err != nil {
				t.Errorf("%s/%s: destination: %v", sc.Name, c.Name, err)
			}
		}
	}
}

func TestCaseCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Case
		ok   bool
	}{
		{"no exception", Case{Output: "ACCEPT"}, true},
		{"exception", Case{Output: "ACCEPT", Except: map[Mode]Exception{IPTables: {Output: "DROP", Why: "because"}}}, true},
		{"no reason", Case{Output: "ACCEPT", Except: map[Mode]Exception{IPTables: {Output: "DROP"}}}, false},
		{"same as the rest", Case{Output: "ACCEPT", Except: map[Mode]Exception{IPTables: {Output: "ACCEPT", Why: "because"}}}, false},
		{"unknown mode", Case{Output: "ACCEPT", Except: map[Mode]Exception{"userspace": {Output: "DROP", Why: "because"}}}, false},
	} {
		if err := tc.c.check(); (err == nil) != tc.ok {
			t.Errorf("%s: check() = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
	c := Case{Output: "ACCEPT", Except: map[Mode]Exception{IPTables: {Output: "DROP", Why: "because"}}}
	if out, _, why := c.Want(IPTables); out != "DROP" || why != "because" {
		t.Errorf("Want(iptables) = %q, %q", out, why)
	}
	if out, _, why := c.Want(NFTables); out != "ACCEPT" || why != "" {
		t.Errorf("Want(nftables) = %q, %q", out, why)
	}
}

func TestSummary(t *testing.T) {
	ap := func(s string) *netip.AddrPort { a := netip.MustParseAddrPort(s); return &a }
	for _, tc := range []struct {
		name     string
		outcomes []trace.Outcome
		out      string
		masq     bool
		problem  bool
	}{
		{"none", nil, "", false, true},
		{"drop", []trace.Outcome{{Verdict: trace.VerdictDrop}}, "DROP", false, false},
		{"reject", []trace.Outcome{{Verdict: trace.VerdictReject}}, "REJECT", false, false},
		{"accept", []trace.Outcome{{Verdict: trace.VerdictAccept}}, "ACCEPT", false, false},
		{"endpoints sorted as addresses", []trace.Outcome{
			{Verdict: trace.VerdictAccept, DNAT: ap("198.18.130.10:8080"), Masquerade: true},
			{Verdict: trace.VerdictAccept, DNAT: ap("198.18.20.10:8080"), Masquerade: true},
		}, "198.18.20.10:8080, 198.18.130.10:8080", true, false},
		{"verdicts disagree", []trace.Outcome{
			{Verdict: trace.VerdictAccept, DNAT: ap("198.18.130.10:8080")},
			{Verdict: trace.VerdictAccept},
		}, "", false, true},
		{"masquerading disagrees", []trace.Outcome{
			{Verdict: trace.VerdictAccept, DNAT: ap("198.18.129.10:8080"), Masquerade: true},
			{Verdict: trace.VerdictAccept, DNAT: ap("198.18.130.10:8080")},
		}, "", false, true},
	} {
		out, masq, problem := Summary(&trace.Result{Outcomes: tc.outcomes})
		if out != tc.out || masq != tc.masq || (problem != "") != tc.problem {
			t.Errorf("%s: Summary = %q, %v, %q", tc.name, out, masq, problem)
		}
	}
}
