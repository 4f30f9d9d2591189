package iptables

import "testing"

// TestJumpKeyOf reads rule lines as iptables-save prints them, comments
// quoted by xtables_save_string (\" and \\ escaped).
func TestJumpKeyOf(t *testing.T) {
	for _, tc := range []struct {
		line string
		want jumpKey
	}{
		{`-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS`,
			jumpKey{"INPUT", "KUBE-NODEPORTS", "kubernetes health check service ports"}},
		{`-A OUTPUT -j KUBE-FIREWALL`, jumpKey{"OUTPUT", "KUBE-FIREWALL", ""}},
		{`-A FORWARD -m comment --comment plain -j ACCEPT`, jumpKey{"FORWARD", "ACCEPT", "plain"}},
		// An escaped quote does not end the comment, and a "-j" inside
		// it is not the target.
		{`-A PREROUTING -m comment --comment "say \"hi\" -j X" -j KUBE-SERVICES`,
			jumpKey{"PREROUTING", "KUBE-SERVICES", `say "hi" -j X`}},
		{`-A PREROUTING -j KUBE-SERVICES -m comment --comment "a \\ b"`,
			jumpKey{"PREROUTING", "KUBE-SERVICES", `a \ b`}},
		// Not a rule iptables-save would print: matches nothing.
		{`-A INPUT -m comment --comment "open -j KUBE-NODEPORTS`, jumpKey{}},
	} {
		if got := jumpKeyOf(tc.line); got != tc.want {
			t.Errorf("jumpKeyOf(%s) = %+v, want %+v", tc.line, got, tc.want)
		}
	}
}
