package harness

import (
	"context"
	"io"
	"slices"
	"strings"
	"testing"
)

// TestArgvIPTablesBackend: every binary in an iptables mode gets the
// backend both ways, so that a kproxy given as NAME=PATH does not pick
// its backend by itself.
func TestArgvIPTablesBackend(t *testing.T) {
	tb := NewTB(context.Background(), io.Discard, t.Name())
	if err := tb.Scope("argv", func(tb *TB) {
		checkArgvBackend(t, tb)
	}); err != nil {
		t.Fatal(err)
	}
}

func checkArgvBackend(t *testing.T, tb *TB) {
	for _, p := range []Proxy{{Name: "kproxy", Bin: "/k"}, {Name: "kproxy-main", Bin: "/m"}, {Name: "upstream", Bin: "/u"}} {
		argv, err := p.argv(tb, "iptables-legacy", "node-0", 0)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(argv, "IPTABLES_MODE=legacy") {
			t.Errorf("%s: no IPTABLES_MODE=legacy in %q", p.Name, argv)
		}
		if !slices.ContainsFunc(argv, func(a string) bool { return strings.HasPrefix(a, "PATH=") && strings.Contains(a, "iptables-legacy") }) {
			t.Errorf("%s: PATH does not start with the legacy shim in %q", p.Name, argv)
		}
	}
}
