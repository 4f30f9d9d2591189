package xtables

import (
	"os"
	"strings"
	"testing"
)

// Every rule kproxy's iptables renderer writes for the example (both
// layouts, both families) and upstream's saved rules pass; each kind of
// rule slipped into kube-proxy's chains is found.
func TestForeignRules(t *testing.T) {
	clean := []string{
		"testdata/iptables-v4.save",
		"testdata/iptables-v6.save",
		"../../proxy/iptables/testdata/example-ipv4.rules",
		"../../proxy/iptables/testdata/example-ipv4-compact.rules",
		"../../proxy/iptables/testdata/example-ipv6.rules",
	}
	for _, path := range clean {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := foreignRules(asSaved(string(data)))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(got) != 0 {
			t.Errorf("%s: kube-proxy's own rules flagged as foreign: %v", path, got)
		}
	}

	base, err := os.ReadFile("testdata/iptables-v4.save")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, table, rule, why string
	}{
		{"DNAT in KUBE-SERVICES", "nat", `-A KUBE-SERVICES -d 198.19.0.10/32 -p tcp -m tcp --dport 80 -m comment --comment "looks like ours" -j DNAT --to-destination 198.18.1.99:8080`, "rewrites addresses"},
		{"uncommented jump in nat KUBE-SERVICES", "nat", `-A KUBE-SERVICES -d 198.19.0.10/32 -p tcp -m tcp --dport 80 -j KUBE-MARK-MASQ`, "no kube-proxy comment"},
		{"ACCEPT in filter KUBE-PROXY-FIREWALL", "filter", `-A KUBE-PROXY-FIREWALL -s 203.0.113.0/24 -j ACCEPT`, "no kube-proxy comment"},
		{"ACCEPT in a service chain", "nat", `-A KUBE-SERVICES -m comment --comment "x" -j ACCEPT`, "ACCEPT in a nat chain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			text := strings.Replace(string(base), "*"+tc.table+"\n", "*"+tc.table+"\n", 1)
			// Insert the rule before the table's COMMIT.
			i := strings.Index(text, "*"+tc.table+"\n")
			if i < 0 {
				t.Fatalf("no %s table in the fixture", tc.table)
			}
			j := i + strings.Index(text[i:], "COMMIT\n")
			text = text[:j] + tc.rule + "\n" + text[j:]
			got, err := foreignRules(text)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0].Rule != tc.rule || !strings.Contains(got[0].Why, tc.why) {
				t.Fatalf("got %v, want the one rule (%s)", got, tc.why)
			}
		})
	}
}

// asSaved turns restore input into what iptables-save would print of it:
// inserts become appends, flushes and deletions go.
func asSaved(restore string) string {
	var out []string
	for _, l := range strings.Split(restore, "\n") {
		switch {
		case strings.HasPrefix(l, "-I "):
			f := strings.SplitN(l, " ", 4)
			out = append(out, "-A "+f[1]+" "+f[3])
		case strings.HasPrefix(l, "-F ") || strings.HasPrefix(l, "-X "):
		default:
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
