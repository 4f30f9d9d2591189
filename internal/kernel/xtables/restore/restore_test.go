package restore

// Addresses: 10.96.0.0/16 service cluster IPs, 10.244.0.0/16 pod IPs.
// Most refusals are tested through their users (xtablestest's Fake
// against the real backends, the iptables tracer); these tests pin what
// the core itself decides: Dialect calls, commit modes, error lines.

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
)

// words is a test Dialect: a rule is its words joined; "-s a,b" stands
// for two rules, as iptables reads it.
type words struct {
	begun, committed []string
}

func (w *words) Begin(t string)  { w.begun = append(w.begun, t) }
func (w *words) Commit(t string) { w.committed = append(w.committed, t) }
func (w *words) Rule(_ *Table[string], _ *Chain[string], ws []xtables.Token) ([]string, error) {
	var out []string
	for i, x := range ws {
		if x.Text == "-s" && i+1 < len(ws) && strings.Contains(ws[i+1].Text, ",") {
			for _, a := range strings.Split(ws[i+1].Text, ",") {
				c := make([]string, 0, len(ws))
				for j, y := range ws {
					if j == i+1 {
						c = append(c, a)
					} else {
						c = append(c, y.Text)
					}
				}
				out = append(out, strings.Join(c, " "))
			}
			return out, nil
		}
		if x.Text == "--bogus" {
			return nil, errors.New("bogus option")
		}
	}
	s := make([]string, len(ws))
	for i, x := range ws {
		s[i] = x.Text
	}
	return []string{strings.Join(s, " ")}, nil
}
func (w *words) Same(a, b string) bool { return a == b }
func (w *words) Text(s string) string  { return s }

func save(ts *Tables[string]) string {
	var b strings.Builder
	for _, n := range ts.Names() {
		b.WriteString(ts.Table(n).Save(&words{}))
	}
	return b.String()
}

const base = "*filter\n:INPUT ACCEPT [0:0]\n:KUBE-A - [0:0]\n-A INPUT -j KUBE-A\n-A KUBE-A -s 10.244.0.1 -j ACCEPT\nCOMMIT\n"

func TestRestoreCommands(t *testing.T) {
	var ts Tables[string]
	d := &words{}
	if err := ts.Restore([]byte(base), Options{}, d); err != nil {
		t.Fatal(err)
	}
	in := `*filter
[1:2] -A KUBE-A -s 10.244.0.2,10.244.0.3 -j ACCEPT
-R KUBE-A 1 -s 10.244.0.9 -j DROP
-I KUBE-A 2 -j RETURN
-D KUBE-A -s 10.244.0.3 -j ACCEPT
-Z KUBE-A
-N KUBE-B
-P FORWARD DROP
COMMIT
*nat
:KUBE-N - [0:0]
COMMIT
`
	if err := ts.Restore([]byte(in), Options{NoFlush: true}, d); err != nil {
		t.Fatal(err)
	}
	want := `*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-A - [0:0]
:KUBE-B - [0:0]
-A INPUT -j KUBE-A
-A KUBE-A -s 10.244.0.9 -j DROP
-A KUBE-A -j RETURN
-A KUBE-A -s 10.244.0.2 -j ACCEPT
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-N - [0:0]
COMMIT
`
	if diff := cmp.Diff(want, save(&ts)); diff != "" {
		t.Errorf("after the commands (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"filter", "filter", "nat"}, d.begun); diff != "" {
		t.Errorf("Begin calls (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"filter", "filter", "nat"}, d.committed); diff != "" {
		t.Errorf("Commit calls (-want +got):\n%s", diff)
	}
	c := ts.Table("filter").Chain("KUBE-A")
	if r := c.Rules[2]; r.Target != "ACCEPT" || r.Goto || r.Line != 2 {
		t.Errorf("rule 3 = %+v, want target ACCEPT from line 2", r)
	}
}

func TestRestoreCommitModes(t *testing.T) {
	in := "*nat\n:KUBE-N - [0:0]\nCOMMIT\n*filter\n-A KUBE-NOPE -j ACCEPT\nCOMMIT\n"
	for _, perTable := range []bool{false, true} {
		var ts Tables[string]
		d := &words{}
		err := ts.Restore([]byte(in), Options{PerTable: perTable}, d)
		var e *Error
		if !errors.As(err, &e) || e.Line != 5 || e.Text != "-A KUBE-NOPE -j ACCEPT" || !strings.Contains(e.Error(), "chain 'KUBE-NOPE' does not exist") {
			t.Fatalf("PerTable=%v: err %v, want line 5 about KUBE-NOPE", perTable, err)
		}
		var want []string
		if perTable {
			want = []string{"nat"}
		}
		if diff := cmp.Diff(want, ts.Names()); diff != "" {
			t.Errorf("PerTable=%v: tables (-want +got):\n%s", perTable, diff)
		}
		if diff := cmp.Diff(want, d.committed); diff != "" {
			t.Errorf("PerTable=%v: Commit calls (-want +got):\n%s", perTable, diff)
		}
	}
}

// TestRestoreCommitError: the kernel's check at COMMIT names the COMMIT
// line and the newest rule on the path; Clone keeps the old state apart.
func TestRestoreCommitError(t *testing.T) {
	var ts Tables[string]
	d := &words{}
	if err := ts.Restore([]byte("*nat\n:MASQ - [0:0]\n-A POSTROUTING -j MASQ\n-A MASQ -j MASQUERADE\nCOMMIT\n"), Options{}, d); err != nil {
		t.Fatal(err)
	}
	before := save(&ts)
	for _, tc := range []struct {
		in       string
		ruleLine int
		want     string
	}{
		{"*nat\n# new jump\n-A PREROUTING -p tcp -j MASQ\nCOMMIT\n", 3, "target MASQUERADE in chain MASQ is reached from hook PREROUTING"},
		{"*nat\n-A MASQ -j MASQ\nCOMMIT\n", 2, "chain MASQ jumps back to MASQ"},
	} {
		c := ts.Clone()
		err := c.Restore([]byte(tc.in), Options{NoFlush: true}, d)
		var e *Error
		commit := strings.Count(tc.in, "\n")
		if !errors.As(err, &e) || !e.AtCommit || e.Line != commit || e.Text != "COMMIT" || e.RuleLine != tc.ruleLine ||
			e.RuleText != strings.Split(tc.in, "\n")[tc.ruleLine-1] || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err %+v, want %q at COMMIT (line %d) naming line %d", tc.in, err, tc.want, commit, tc.ruleLine)
		}
	}
	if diff := cmp.Diff(before, save(&ts)); diff != "" {
		t.Errorf("restores into clones changed the original:\n%s", diff)
	}
	// A path of older rules only (here left by a syntax-only restore,
	// which checks no loop) names no rule line.
	if err := ts.Restore([]byte("*nat\n-A MASQ -j MASQ\nCOMMIT\n"), Options{NoFlush: true, SyntaxOnly: true}, d); err != nil {
		t.Fatal(err)
	}
	err := ts.Restore([]byte("*nat\n:KUBE-X - [0:0]\nCOMMIT\n"), Options{NoFlush: true}, d)
	var e *Error
	if !errors.As(err, &e) || !e.AtCommit || e.Line != 3 || e.RuleLine != 0 || e.RuleText != "" {
		t.Errorf("err %+v, want a COMMIT error at line 3 naming no rule", err)
	}
}

// TestRestoreSyntaxOnly: iptables-nft-restore --test resolves no chain.
func TestRestoreSyntaxOnly(t *testing.T) {
	var ts Tables[string]
	in := "*filter\n-A KUBE-NEW -j KUBE-OTHER\n-I KUBE-NEW 9 -j ACCEPT\n-D INPUT -j KUBE-GONE\n-A INPUT -j KUBE-NEW\n-A KUBE-NEW -j INPUT\nCOMMIT\n"
	err := ts.Restore([]byte(in), Options{SyntaxOnly: true}, &words{})
	var e *Error
	if !errors.As(err, &e) || e.Line != 6 || !strings.Contains(err.Error(), "cannot jump to built-in chain INPUT") {
		t.Fatalf("err %v, want line 6: a jump to a built-in chain is still refused", err)
	}
	in = strings.Replace(in, "-A KUBE-NEW -j INPUT\n", "-A KUBE-NEW -g KUBE-NEW\n", 1)
	if err := ts.Restore([]byte(in), Options{SyntaxOnly: true}, &words{}); err != nil {
		t.Fatalf("syntax-only restore: %v", err)
	}
	if err := ts.Restore([]byte(in), Options{}, &words{}); err == nil {
		t.Fatal("the same input passed a real restore")
	}
}

func TestRestoreRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		line     int
		want     string
	}{
		{"dialect error", "*filter\n-A INPUT --bogus -j ACCEPT\nCOMMIT\n", 2, "bogus option"},
		{"quote", "*filter\n-A INPUT -m comment --comment \"x -j ACCEPT\nCOMMIT\n", 2, "unterminated quoted string"},
		{"quoted -t is a word", "*filter\n-A INPUT \"-t\" nat\n-A INPUT -t nat\nCOMMIT\n", 3, "-t option"},
		{"quoted rule number", "*filter\n-D INPUT \"1\"\nCOMMIT\n", 2, `no rule "1" in chain INPUT`},
		{"-R of several", "*filter\n:A - [0:0]\n-A A -j ACCEPT\n-R A 1 -s 10.244.0.1,10.244.0.2 -j DROP\nCOMMIT\n", 4, "several"},
		{"-R without number", "*filter\n-R INPUT -j DROP\nCOMMIT\n", 2, "-R needs a rule number"},
		{"-D number and more", "*filter\n-A INPUT -j DROP\n-D INPUT 1 -j DROP\nCOMMIT\n", 3, `unexpected "-j" after the rule number`},
		{"-N of a built-in name", "*filter\n-N PREROUTING\nCOMMIT\n", 2, "not a built-in chain of table filter"},
		{"-P on a user chain", "*filter\n:A - [0:0]\n-P A DROP\nCOMMIT\n", 3, "cannot set a policy on user-defined chain A"},
		{"-P bad", "*filter\n-P INPUT REJECT\nCOMMIT\n", 2, "-P needs ACCEPT or DROP"},
		{"bad counters", "*filter\n:A - [x:0]\nCOMMIT\n", 2, "bad counters"},
		{"COMMIT alone", "COMMIT\n", 1, "COMMIT outside a table"},
		{"-X of all refused", "*filter\n:A - [0:0]\n:B - [0:0]\n-A INPUT -j B\n-X\nCOMMIT\n", 5, "cannot delete chain B: a rule in chain INPUT still jumps to it"},
		{"target in the wrong table", "*nat\n-A PREROUTING -j TPROXY\nCOMMIT\n", 2, "target TPROXY is only valid in table mangle, not nat"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ts Tables[string]
			err := ts.Restore([]byte(tc.in), Options{}, &words{})
			var e *Error
			if !errors.As(err, &e) || e.Line != tc.line || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want line %d containing %q", err, tc.line, tc.want)
			}
			if e.Text != strings.TrimSpace(strings.Split(tc.in, "\n")[tc.line-1]) {
				t.Errorf("error text %q is not line %d", e.Text, tc.line)
			}
			if len(ts.Names()) != 0 {
				t.Errorf("a failed restore left tables %v", ts.Names())
			}
		})
	}
}

func TestTargets(t *testing.T) {
	if diff := cmp.Diff([]string{"PREROUTING", "OUTPUT"}, TargetHooks("DNAT")); diff != "" || TargetHooks("MARK") != nil {
		t.Errorf("TargetHooks: DNAT %v, MARK %v", TargetHooks("DNAT"), TargetHooks("MARK"))
	}
}
