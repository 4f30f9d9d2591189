package iptables

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/kproxy/kproxy/internal/trace"
)

// minimal wraps rules in a filter and a nat table with their built-in
// chains: a filter rule is line 5; a nat rule is line 11 when there is no
// filter rule.
func minimal(filterRules, natRules string) string {
	return `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
` + filterRules + `COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
` + natRules + `COMMIT
`
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name        string
		input       string
		line        int
		want        string
		unsupported bool
	}{
		{name: "rule before a table", input: "-A INPUT -j ACCEPT\n", line: 1, want: `expected "*table"`},
		{name: "unknown table", input: "*foo\nCOMMIT\n", line: 1, want: "unable to initialize table 'foo'"},
		{name: "missing COMMIT", input: "*nat\n:X - [0:0]\n", line: 3, want: "table nat has no COMMIT"},
		{name: "next table before COMMIT", input: "*nat\n*filter\nCOMMIT\n", line: 2, want: "no COMMIT before the next table"},
		{name: "rule in a missing chain", input: minimal("-A NOPE -j ACCEPT\n", ""), line: 5, want: "chain 'NOPE' does not exist in table filter"},
		{name: "jump to a missing chain", input: minimal("-A INPUT -j NOPE\n", ""), line: 5, want: "couldn't load target `NOPE'"},
		{name: "jump to a built-in chain", input: minimal("-A INPUT -j OUTPUT\n", ""), line: 5, want: "cannot jump to built-in chain"},
		{name: "goto a built-in chain", input: minimal("-A INPUT -g OUTPUT\n", ""), line: 5, want: "cannot goto built-in chain"},
		{name: "unknown option", input: minimal("-A INPUT --frobnicate 1 -j ACCEPT\n", ""), line: 5, want: `unknown option "--frobnicate"`},
		{name: "port option without a match", input: minimal("-A INPUT --dport 80 -j ACCEPT\n", ""), line: 5, want: `unknown option "--dport"`},
		{name: "stray word", input: minimal("-A INPUT tcp -j ACCEPT\n", ""), line: 5, want: `unexpected word "tcp"`},
		{name: "unknown match", input: minimal("-A INPUT -p tcp -m multiport --dports 80,443 -j ACCEPT\n", ""), line: 5, want: `match "multiport"`, unsupported: true},
		{name: "LOG target", input: minimal("-A INPUT -j LOG\n", ""), line: 5, want: "target LOG", unsupported: true},
		{name: "SNAT target", input: minimal("", "-A POSTROUTING -j SNAT --to-source 10.0.0.10\n"), line: 11, want: "target SNAT", unsupported: true},
		{name: "tcp match without -p tcp", input: minimal("-A INPUT -m tcp --dport 80 -j ACCEPT\n", ""), line: 5, want: "match tcp needs -p tcp"},
		{name: "tcp match with -p udp", input: minimal("-A INPUT -m tcp -p udp --dport 80 -j ACCEPT\n", ""), line: 5, want: "match tcp needs -p tcp"},
		{name: "negated -m", input: minimal("-A INPUT ! -m tcp -p tcp -j ACCEPT\n", ""), line: 5, want: "cannot be negated"},
		{name: "double negation", input: minimal("-A INPUT ! ! -s 10.0.0.1 -j ACCEPT\n", ""), line: 5, want: `"!" given twice`},
		{name: "bad address", input: minimal("-A INPUT -s 10.0.0.300 -j ACCEPT\n", ""), line: 5, want: `invalid address "10.0.0.300"`},
		{name: "host name", input: minimal("-A INPUT -s example.com -j ACCEPT\n", ""), line: 5, want: "host names are not resolved"},
		{name: "both families", input: minimal("-A INPUT -s 10.0.0.1 -j ACCEPT\n-A INPUT -s fd00::1 -j ACCEPT\n", ""), line: 6, want: "fd00::1 is IPv6 but the ruleset holds IPv4 rules"},
		{name: "families across tables", input: minimal("-A INPUT -s 10.0.0.1 -j ACCEPT\n", "-A PREROUTING -p tcp -j DNAT --to-destination [fd00::1]:80\n"), line: 12, want: "is IPv6 but the ruleset holds IPv4"},
		{name: "unterminated quote", input: minimal("-A INPUT -m comment --comment \"oops -j ACCEPT\n", ""), line: 5, want: "unterminated quoted string"},
		{name: "policy on a user chain", input: "*filter\n:FOO ACCEPT [0:0]\nCOMMIT\n", line: 2, want: "can't set policy"},
		{name: "bad built-in policy", input: "*filter\n:INPUT REJECT [0:0]\nCOMMIT\n", line: 2, want: "bad policy name"},
		{name: "another table's built-in chain", input: "*filter\n:PREROUTING - [0:0]\nCOMMIT\n", line: 2, want: "not a built-in chain of table filter"},
		{name: "chain declared twice", input: "*filter\n:FOO - [0:0]\n:FOO - [0:0]\nCOMMIT\n", line: 3, want: "declared twice"},
		{name: "chain name too long", input: "*filter\n:" + strings.Repeat("X", 29) + " - [0:0]\nCOMMIT\n", line: 2, want: "28 chars max"},
		{name: "chain named like a target", input: "*filter\n:DNAT - [0:0]\nCOMMIT\n", line: 2, want: "may not clash with a target name"},
		{name: "DNAT in filter", input: minimal("-A INPUT -p tcp -j DNAT --to-destination 10.0.0.1:80\n", ""), line: 5, want: "only valid in table nat"},
		{name: "REJECT in nat", input: minimal("", "-A PREROUTING -j REJECT\n"), line: 11, want: "REJECT is only valid in table filter"},
		{name: "DNAT on POSTROUTING", input: minimal("", "-A POSTROUTING -p tcp -j DNAT --to-destination 10.0.0.1:80\n"), line: 11, want: "reached from hook POSTROUTING"},
		{
			name:  "MASQUERADE reached from PREROUTING through a user chain",
			input: minimal("", ":MASQ - [0:0]\n-A POSTROUTING -j MASQ\n-A PREROUTING -j MASQ\n-A MASQ -j MASQUERADE\n"),
			line:  14, want: "target MASQUERADE in chain MASQ is reached from hook PREROUTING",
		},
		{
			name:  "loop between chains",
			input: "*filter\n:INPUT ACCEPT [0:0]\n:A - [0:0]\n:B - [0:0]\n-A INPUT -j A\n-A A -j B\n-A B -s 10.0.0.1 -g A\nCOMMIT\n",
			line:  7, want: "chain B jumps back to A",
		},
		{name: "-i on OUTPUT", input: minimal("-A OUTPUT -i eth0 -j ACCEPT\n", ""), line: 5, want: "cannot use -i in chain OUTPUT"},
		{name: "-o on PREROUTING", input: minimal("", "-A PREROUTING -o eth0 -j ACCEPT\n"), line: 11, want: "cannot use -o in chain PREROUTING"},
		{name: "-X of a built-in chain", input: minimal("-X INPUT\n", ""), line: 5, want: "cannot delete built-in chain"},
		{name: "-X of a chain with rules", input: "*filter\n:FOO - [0:0]\n-A FOO -j ACCEPT\n-X FOO\nCOMMIT\n", line: 4, want: "still has 1 rules"},
		{name: "-X of a chain still jumped to", input: "*filter\n:INPUT ACCEPT [0:0]\n:FOO - [0:0]\n-A INPUT -j FOO\n-X FOO\nCOMMIT\n", line: 5, want: "a rule in chain INPUT still jumps to it"},
		{name: "probability above 1", input: minimal("-A INPUT -m statistic --mode random --probability 1.5 -j ACCEPT\n", ""), line: 5, want: "invalid probability"},
		{name: "statistic nth mode", input: minimal("-A INPUT -m statistic --mode nth --every 2 -j ACCEPT\n", ""), line: 5, want: `statistic mode "nth"`, unsupported: true},
		{name: "statistic without probability", input: minimal("-A INPUT -m statistic --mode random -j ACCEPT\n", ""), line: 5, want: "statistic needs"},
		{name: "recent --update", input: minimal("-A INPUT -m recent --update --name X -j ACCEPT\n", ""), line: 5, want: "recent option --update", unsupported: true},
		{name: "recent --reap without --seconds", input: minimal("-A INPUT -m recent --rcheck --reap --name X -j ACCEPT\n", ""), line: 5, want: "--reap needs --seconds"},
		{name: "recent without operation", input: minimal("-A INPUT -m recent --name X -j ACCEPT\n", ""), line: 5, want: "recent needs --set or --rcheck"},
		{name: "DNAT range", input: minimal("", "-A PREROUTING -p tcp -j DNAT --to-destination 10.0.0.1-10.0.0.2\n"), line: 11, want: "DNAT range", unsupported: true},
		{name: "DNAT port without a protocol", input: minimal("", "-A PREROUTING -j DNAT --to-destination 10.0.0.1:80\n"), line: 11, want: "DNAT to a port needs -p tcp, udp or sctp"},
		{name: "DNAT without destination", input: minimal("", "-A PREROUTING -p tcp -j DNAT\n"), line: 11, want: "DNAT needs --to-destination"},
		{name: "MASQUERADE --to-ports", input: minimal("", "-A POSTROUTING -p tcp -j MASQUERADE --to-ports 1000\n"), line: 11, want: "MASQUERADE --to-ports", unsupported: true},
		{name: "tcp-reset without -p tcp", input: minimal("-A INPUT -j REJECT --reject-with tcp-reset\n", ""), line: 5, want: "tcp-reset needs -p tcp"},
		{name: "unknown reject type", input: minimal("-A INPUT -j REJECT --reject-with politely\n", ""), line: 5, want: `unknown reject type "politely"`},
		{name: "MARK without operation", input: minimal("-A INPUT -j MARK\n", ""), line: 5, want: "MARK needs one of"},
		{name: "two targets", input: minimal("-A INPUT -j ACCEPT -j DROP\n", ""), line: 5, want: "more than one target"},
		{name: "addrtype BLACKHOLE", input: minimal("-A INPUT -m addrtype --dst-type BLACKHOLE -j DROP\n", ""), line: 5, want: "address type BLACKHOLE", unsupported: true},
		{name: "addrtype --limit-iface-in", input: minimal("-A INPUT -m addrtype --dst-type LOCAL --limit-iface-in -j DROP\n", ""), line: 5, want: "--limit-iface-in", unsupported: true},
		{name: "conntrack --ctstatus", input: minimal("-A INPUT -m conntrack --ctstatus CONFIRMED -j DROP\n", ""), line: 5, want: "conntrack option --ctstatus", unsupported: true},
		{name: "unknown ctstate", input: minimal("-A INPUT -m conntrack --ctstate SLEEPY -j DROP\n", ""), line: 5, want: `unknown conntrack state "SLEEPY"`},
		{name: "comment too long", input: minimal("-A INPUT -m comment --comment "+strings.Repeat("x", 256)+" -j ACCEPT\n", ""), line: 5, want: "comment longer than 255"},
		{name: "fragments", input: minimal("-A INPUT -f -j DROP\n", ""), line: 5, want: "option -f", unsupported: true},
		{name: "-R out of range", input: minimal("-R INPUT 1 -j ACCEPT\n", ""), line: 5, want: "index of replacement 1 too big"},
		{name: "-D of a missing rule", input: minimal("-D INPUT -j ACCEPT\n", ""), line: 5, want: `no rule "-j ACCEPT" in chain INPUT`},
		{name: "-P on a user chain", input: "*filter\n:FOO - [0:0]\n-P FOO DROP\nCOMMIT\n", line: 3, want: "cannot set a policy on user-defined chain"},
		{name: "unknown command", input: minimal("-E INPUT FOO\n", ""), line: 5, want: `unknown command "-E"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.input))
			if err == nil {
				t.Fatalf("Parse accepted:\n%s", tc.input)
			}
			var pe *trace.ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error %v is not a *trace.ParseError", err)
			}
			if pe.Line != tc.line || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q at line %d, want line %d containing %q", err, pe.Line, tc.line, tc.want)
			}
			if got := errors.Is(err, ErrUnsupported); got != tc.unsupported {
				t.Errorf("errors.Is(err, ErrUnsupported) = %v, want %v (%v)", got, tc.unsupported, err)
			}
			if pe.Line > 0 {
				lines := strings.Split(tc.input, "\n")
				if want := strings.TrimSpace(lines[pe.Line-1]); pe.Text != want {
					t.Errorf("error text %q, want the line %q", pe.Text, want)
				}
			}
		})
	}
}

// TestParseRoundTrip: the dump reads back to the same ruleset, and it is
// written the way iptables-save writes rules.
func TestParseRoundTrip(t *testing.T) {
	r, err := Parse([]byte(allServices))
	if err != nil {
		t.Fatal(err)
	}
	d := r.String()
	r2, err := Parse([]byte(d))
	if err != nil {
		t.Fatalf("Parse(String()): %v\n%s", err, d)
	}
	if diff := cmp.Diff(d, r2.String()); diff != "" {
		t.Errorf("round trip (-first +second):\n%s", diff)
	}
	for _, want := range []string{
		"*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-EXTERNAL-SERVICES - [0:0]\n",
		`-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA`,
		`-A KUBE-SVC-AAAAAAAAAAAAAAAA -m comment --comment "ns1/svc1:p80 -> 10.180.1.1:8080" -m statistic --mode random --probability 0.33333333349 -j KUBE-SEP-AAAAAAAAAAAAAAA1`,
		`-A KUBE-SEP-AAAAAAAAAAAAAAA1 -s 10.180.1.1/32 -m comment --comment "ns1/svc1:p80" -j KUBE-MARK-MASQ`,
		`-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000`,
		`-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0`,
		`-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN`,
		`-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`,
		`-A KUBE-SVC-EEEEEEEEEEEEEEEE -m comment --comment "ns5/svc5:p80 -> 10.180.2.5:80" -m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-EEEEEEEEEEEEEEE1 --mask 255.255.255.255 --rsource -j KUBE-SEP-EEEEEEEEEEEEEEE1`,
		`-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`,
		`-A KUBE-SERVICES -d 10.96.0.3/32 -p tcp -m comment --comment "ns3/svc3:p80 has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable`,
		`-A KUBE-FW-DDDDDDDDDDDDDDDD -m comment --comment "other traffic to ns4/svc4:p80 will be dropped by KUBE-PROXY-FIREWALL"` + "\n",
	} {
		if !strings.Contains(d, want) {
			t.Errorf("dump lacks %q", want)
		}
	}
	if r.Family() != 4 {
		t.Errorf("Family() = %d, want 4", r.Family())
	}
}

func TestParseSyntax(t *testing.T) {
	for _, tc := range []struct {
		name, rule, want string
	}{
		{"quoted comment with an escaped quote", `-A INPUT -m comment --comment "say \"hi\" now" -j ACCEPT`, `-A INPUT -m comment --comment "say \"hi\" now" -j ACCEPT`},
		{"long option names", `-A INPUT --source 10.0.0.1 --destination 10.0.0.0/255.255.0.0 --in-interface eth+ --protocol udp --match udp --destination-port 53 --jump ACCEPT`, `-A INPUT -s 10.0.0.1/32 -d 10.0.0.0/16 -i eth+ -p udp -m udp --dport 53 -j ACCEPT`},
		{"implicit protocol match", `-A INPUT -p tcp --dport 80:90 --syn -j ACCEPT`, `-A INPUT -p tcp -m tcp --dport 80:90 --tcp-flags FIN,SYN,RST,ACK SYN -j ACCEPT`},
		{"counters are ignored", `[12:345] -A INPUT -c 1 2 -j ACCEPT`, `-A INPUT -j ACCEPT`},
		{"mark targets in the kernel's form", `-A INPUT -j MARK --set-mark 0x10/0xf0`, `-A INPUT -j MARK --set-xmark 0x10/0xf0`},
		{"and-mark", `-A INPUT -j MARK --and-mark 0xff`, `-A INPUT -j MARK --set-xmark 0x0/0xffffff00`},
		{"decimal mark", `-A INPUT -m mark --mark 16384 -j ACCEPT`, `-A INPUT -m mark --mark 0x4000 -j ACCEPT`},
		{"reject aliases", `-A INPUT -p tcp -j REJECT --reject-with tcp-rst`, `-A INPUT -p tcp -j REJECT --reject-with tcp-reset`},
		{"reject default", `-A INPUT -j REJECT`, `-A INPUT -j REJECT --reject-with icmp-port-unreachable`},
		{"probability is kept as the kernel's 31-bit fraction", `-A INPUT -m statistic --mode random --probability 0.2 -j ACCEPT`, `-A INPUT -m statistic --mode random --probability 0.20000000019 -j ACCEPT`},
		{"address lists give one rule per address", `-A INPUT -s 10.0.0.1,10.0.0.2 -j ACCEPT`, "-A INPUT -s 10.0.0.1/32 -j ACCEPT\n-A INPUT -s 10.0.0.2/32 -j ACCEPT"},
		{"DNAT without port, goto", `-A INPUT -g FOO`, `-A INPUT -g FOO`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Parse([]byte("*filter\n:INPUT ACCEPT [0:0]\n:FOO - [0:0]\n" + tc.rule + "\nCOMMIT\n"))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(r.String(), "\n"+tc.want+"\n") {
				t.Errorf("dump lacks %q:\n%s", tc.want, r)
			}
			if _, err := Parse([]byte(r.String())); err != nil {
				t.Errorf("dump does not parse back: %v", err)
			}
		})
	}
}

// svc1b is svc1 after its third endpoint was replaced by 10.180.4.1.
var svc1b = svcRules{
	natChains: strings.ReplaceAll(svc1.natChains, "AAAAAAAAAAAAAAA3", "AAAAAAAAAAAAAAA4"),
	nat:       svc1.nat,
	natOwn:    strings.ReplaceAll(strings.ReplaceAll(svc1.natOwn, "AAAAAAAAAAAAAAA3", "AAAAAAAAAAAAAAA4"), "10.180.3.1", "10.180.4.1"),
}

const nodePortsLast = `-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
`

// TestApplyPartialNoflush replays a kube-proxy partial sync: KUBE-SERVICES
// and KUBE-NODEPORTS rewritten, the changed service's chains rewritten, a
// stale endpoint chain and a removed service's chains flushed and deleted,
// everything else left as it was.
func TestApplyPartialNoflush(t *testing.T) {
	r, err := Parse([]byte(dump(svc1, svc5)))
	if err != nil {
		t.Fatal(err)
	}
	filterBefore := tableDump(t, r, "filter")
	partial := "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n" + svc1b.natChains +
		":KUBE-SEP-AAAAAAAAAAAAAAA3 - [0:0]\n:KUBE-SVC-EEEEEEEEEEEEEEEE - [0:0]\n:KUBE-SEP-EEEEEEEEEEEEEEE1 - [0:0]\n:KUBE-SEP-EEEEEEEEEEEEEEE2 - [0:0]\n" +
		svc1b.nat + svc1b.natOwn +
		"-X KUBE-SEP-AAAAAAAAAAAAAAA3\n-X KUBE-SVC-EEEEEEEEEEEEEEEE\n-X KUBE-SEP-EEEEEEEEEEEEEEE1\n-X KUBE-SEP-EEEEEEEEEEEEEEE2\n" +
		nodePortsLast + "COMMIT\n"
	if err := r.Apply([]byte(partial), true); err != nil {
		t.Fatalf("Apply: %v", err)
	}

	// The state equals a full restore of the new services.
	want, err := Parse([]byte(dump(svc1b)))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want.String(), r.String()); diff != "" {
		t.Errorf("state after the partial restore (-full restore +partial):\n%s", diff)
	}
	if diff := cmp.Diff(filterBefore, tableDump(t, r, "filter")); diff != "" {
		t.Errorf("the filter table changed:\n%s", diff)
	}

	res, err := r.Trace(pkt(tcp, "10.180.1.5", "10.96.0.1", 80, "cali1"), node4)
	if err != nil {
		t.Fatal(err)
	}
	wantOut := []string{
		out("accept", "10.180.1.1:8080", false, third),
		out("accept", "10.180.2.1:8080", false, third),
		out("accept", "10.180.4.1:8080", false, third),
	}
	if diff := cmp.Diff(wantOut, summarize(res)); diff != "" {
		t.Errorf("svc1 after the update (-want +got):\n%s", diff)
	}
	res, err = r.Trace(pkt(tcp, "10.180.1.5", "10.96.0.5", 80, "cali1"), node4)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{out("accept", "", false, 1)}, summarize(res)); diff != "" {
		t.Errorf("removed svc5 (-want +got):\n%s", diff)
	}
}

func tableDump(t *testing.T, r *Ruleset, name string) string {
	t.Helper()
	d := r.String()
	i := strings.Index(d, "*"+name+"\n")
	if i < 0 {
		t.Fatalf("no table %s in\n%s", name, d)
	}
	return d[i : i+strings.Index(d[i:], "COMMIT\n")]
}

// TestApplyFailureKeepsState: a partial restore that deletes a chain still
// jumped to fails as iptables-restore would, and changes nothing.
func TestApplyFailureKeepsState(t *testing.T) {
	r, err := Parse([]byte(dump(svc1, svc5)))
	if err != nil {
		t.Fatal(err)
	}
	before := r.String()
	partial := "*nat\n:KUBE-SVC-EEEEEEEEEEEEEEEE - [0:0]\n-X KUBE-SVC-EEEEEEEEEEEEEEEE\nCOMMIT\n"
	err = r.Apply([]byte(partial), true)
	var pe *trace.ParseError
	if !errors.As(err, &pe) || pe.Line != 3 || !strings.Contains(err.Error(), "a rule in chain KUBE-SERVICES still jumps to it") {
		t.Fatalf("Apply error %v, want line 3 about KUBE-SERVICES", err)
	}
	if diff := cmp.Diff(before, r.String()); diff != "" {
		t.Errorf("a failed restore changed the ruleset:\n%s", diff)
	}
	// Trace still sees the old chains.
	res, err := r.Trace(pkt(tcp, "10.180.1.5", "10.96.0.5", 80, "cali1"), node4)
	if err != nil || len(res.Outcomes) != 2 {
		t.Errorf("trace after a failed restore: %v\n%s", err, res)
	}
}

// TestApplyCommitsPerTable: like iptables-restore, tables committed before
// the failing one stay.
func TestApplyCommitsPerTable(t *testing.T) {
	r, err := Parse([]byte(minimal("", "")))
	if err != nil {
		t.Fatal(err)
	}
	err = r.Apply([]byte("*filter\n-A INPUT -j DROP\nCOMMIT\n*nat\n-A PREROUTING -j NOPE\nCOMMIT\n"), true)
	var pe *trace.ParseError
	if !errors.As(err, &pe) || pe.Line != 5 {
		t.Fatalf("Apply error %v, want one at line 5", err)
	}
	if !strings.Contains(r.String(), "-A INPUT -j DROP\n") {
		t.Errorf("the committed filter table was lost:\n%s", r)
	}
	if strings.Contains(r.String(), "-A PREROUTING") {
		t.Errorf("the failing nat table was applied:\n%s", r)
	}
}

// TestApplyFlushSemantics: without --noflush a named table is emptied
// (user chains deleted, built-in policies kept) and other tables are left
// alone; with --noflush declaring a built-in chain does not flush it.
func TestApplyFlushSemantics(t *testing.T) {
	r, err := Parse([]byte(allServices))
	if err != nil {
		t.Fatal(err)
	}
	natBefore := tableDump(t, r, "nat")
	if err := r.Apply([]byte("*filter\n-P FORWARD DROP\nCOMMIT\n"), true); err != nil {
		t.Fatal(err)
	}
	if err := r.Apply([]byte("*filter\n:INPUT ACCEPT [0:0]\n:KUBE-NEW - [0:0]\n-A INPUT -j KUBE-NEW\nCOMMIT\n"), false); err != nil {
		t.Fatal(err)
	}
	want := "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-NEW - [0:0]\n-A INPUT -j KUBE-NEW\n"
	if diff := cmp.Diff(want, tableDump(t, r, "filter")); diff != "" {
		t.Errorf("filter after a flushing restore (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(natBefore, tableDump(t, r, "nat")); diff != "" {
		t.Errorf("nat changed by a restore of filter:\n%s", diff)
	}

	if err := r.Apply([]byte("*filter\n:INPUT ACCEPT [0:0]\n:KUBE-NEW - [0:0]\n-A KUBE-NEW -j ACCEPT\nCOMMIT\n"), true); err != nil {
		t.Fatal(err)
	}
	want = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-NEW - [0:0]\n-A INPUT -j KUBE-NEW\n-A KUBE-NEW -j ACCEPT\n"
	if diff := cmp.Diff(want, tableDump(t, r, "filter")); diff != "" {
		t.Errorf("filter after a --noflush restore (-want +got):\n%s", diff)
	}
}

// TestApplyNamesTheNewLine: when a restore makes an older rule invalid (a
// new jump reaches an old MASQUERADE from PREROUTING), the error names the
// new line.
func TestApplyNamesTheNewLine(t *testing.T) {
	r, err := Parse([]byte(minimal("", ":MASQ - [0:0]\n-A POSTROUTING -j MASQ\n-A MASQ -j MASQUERADE\n")))
	if err != nil {
		t.Fatal(err)
	}
	err = r.Apply([]byte("*nat\n# a comment line\n-A PREROUTING -p tcp -j MASQ\nCOMMIT\n"), true)
	var pe *trace.ParseError
	if !errors.As(err, &pe) || pe.Line != 3 || pe.Text != "-A PREROUTING -p tcp -j MASQ" ||
		!strings.Contains(err.Error(), "target MASQUERADE in chain MASQ is reached from hook PREROUTING") {
		t.Fatalf("Apply error %v, want line 3 naming the new jump", err)
	}
}

func TestApplyCommands(t *testing.T) {
	r, err := Parse([]byte("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n"))
	if err != nil {
		t.Fatal(err)
	}
	steps := `*filter
-N A
-A A -s 10.0.0.3 -j ACCEPT
-I A -s 10.0.0.1 -j ACCEPT
-I A 2 -s 10.0.0.2 -j ACCEPT
-A A -s 10.0.0.4 -j ACCEPT
-A A -s 10.0.0.5 -j ACCEPT
-R A 3 -s 10.0.0.33 -j DROP
-D A 4
-D A -s 10.0.0.5/32 -j ACCEPT
-N B
-A B -j DROP
-F B
-X B
-P OUTPUT DROP
-Z
-A INPUT -j A
COMMIT
`
	if err := r.Apply([]byte(steps), true); err != nil {
		t.Fatal(err)
	}
	want := `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT DROP [0:0]
:A - [0:0]
-A INPUT -j A
-A A -s 10.0.0.1/32 -j ACCEPT
-A A -s 10.0.0.2/32 -j ACCEPT
-A A -s 10.0.0.33/32 -j DROP
COMMIT
`
	if diff := cmp.Diff(want, r.String()); diff != "" {
		t.Errorf("after the commands (-want +got):\n%s", diff)
	}
	res, err := r.Trace(pkt(tcp, "10.0.0.33", "10.0.0.10", 80, "eth0"), node4)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{out("drop", "", false, 1)}, summarize(res)); diff != "" {
		t.Errorf("trace (-want +got):\n%s", diff)
	}
}

func TestAddRecent(t *testing.T) {
	r, err := Parse([]byte(allServices))
	if err != nil {
		t.Fatal(err)
	}
	r.AddRecent("KUBE-SEP-EEEEEEEEEEEEEEE1", netip.MustParseAddr("10.180.1.5"))
	res, err := r.Trace(pkt(tcp, "10.180.1.5", "10.96.0.5", 80, "cali1"), node4)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{out("accept", "10.180.2.5:80", false, 1)}, summarize(res)); diff != "" {
		t.Errorf("after AddRecent (-want +got):\n%s", diff)
	}
}
