package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTraceIPTables: trace follows the iptables rules of the example (as
// rendered for a fresh node) and of a saved rules file in iptables-save
// syntax, recognised without --proxy-mode.
func TestTraceIPTables(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []string
		not  []string
	}{
		{"node to a ClusterIP", []string{"--dst", "198.19.0.10:80"},
			[]string{"KUBE-SVC-", "dnat to 198.18.129.10:8080", "dnat to 198.18.130.10:8080", "p=0.5"}, nil},
		{"node port on localhost", []string{"--dst", "127.0.0.1:30080"},
			[]string{"KUBE-NODEPORTS", "dnat to"}, nil},
		{"other source to the LB is dropped", []string{"--src", "192.0.2.7", "--iif", "eth0", "--dst", "198.19.200.1:443"},
			[]string{"drop"}, []string{"dnat to"}},
		{"service without endpoints is rejected", []string{"--src", "198.18.129.5", "--iif", "veth1", "--dst", "198.19.0.20:80"},
			[]string{"reject"}, []string{"dnat to"}},
		{"IPv6 service", []string{"--dst", "[fd00:19::17]:80"},
			[]string{"dnat to [fd00:18:1:a::50]:8080", "dnat to [fd00:18:1:b::50]:8080"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := execute(t, append([]string{"trace", "--proxy-mode", "iptables"}, tc.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("trace output lacks %q:\n%s", w, out)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(out, n) {
					t.Errorf("trace output has %q:\n%s", n, out)
				}
			}
		})
	}

	rules, _, err := execute(t, "render", "--proxy-mode", "iptables")
	if err != nil {
		t.Fatal(err)
	}
	// render prints both families; a saved iptables-save file has one.
	v4, _, _ := strings.Cut(rules, "# IPv6")
	path := filepath.Join(t.TempDir(), "rules.v4")
	if err := os.WriteFile(path, []byte(v4), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err := execute(t, "trace", "--rules", path, "--local-address", "198.18.0.10", "--src", "198.18.129.5", "--iif", "veth1", "--dst", "198.19.0.13:8080")
	if err != nil || !strings.Contains(out, "KUBE-SERVICES") || !strings.Contains(out, "dnat to 198.18.129.10:8080") {
		t.Fatalf("trace over an iptables rules file: %v\n%s", err, out)
	}
	if _, _, err := execute(t, "trace", "--rules", path, "--dst", "[fd00:19::17]:80"); err == nil {
		t.Fatalf("IPv6 destination over IPv4 rules: want an error")
	}
}
