package nft

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// readAll reads text and returns each operation as "LINE: TEXT", text.go's
// text of it, with the Parsed fields an Op does not hold appended.
func readAll(text string, sets SetLookup) ([]string, error) {
	var out []string
	err := Read(text, sets, func(p *Parsed) error {
		tx := NewTransaction(p.Family, p.Table)
		tx.Ops = append(tx.Ops, p.Op)
		s := fmt.Sprintf("%d: %s", p.Line, strings.TrimSuffix(tx.String(), "\n"))
		if p.Create {
			s += " [create]"
		}
		if p.Policy != "" {
			s += " [policy " + string(p.Policy) + "]"
		}
		if p.ByHandle {
			s += fmt.Sprintf(" [handle %d]", p.Handle)
		}
		if p.Block != "" {
			s += " [" + p.Block + "]"
		}
		if p.Lossy != "" {
			s += " [lossy: " + p.Lossy + "]"
		}
		out = append(out, s)
		return nil
	})
	return out, err
}

// TestReadVariants: the spellings the kernel's listing (and people) use
// beyond text.go's own, each read as the statement text.go prints; those
// the objects do not keep are marked lossy, and Parse refuses them.
func TestReadVariants(t *testing.T) {
	for _, tc := range []struct{ in, want, lossy string }{
		{"meta mark & 0x00004000 == 0x00000000 return", "meta mark & 0x00004000 == 0 return", ""},
		{"meta mark set meta mark or 0x4000", "meta mark set meta mark | 0x00004000", ""},
		{"counter packets 12 bytes 3400 accept", "counter accept", "counter values"},
		{"reject with icmp type port-unreachable", "reject", "reject with ..."},
		{"reject with tcp reset", "reject", "reject with ..."},
		{"masquerade", "masquerade fully-random", "masquerade without fully-random"},
		{"ip daddr == 10.0.0.1 accept", "ip daddr 10.0.0.1 accept", ""},
		{"ip daddr 10.0.0.0/8 accept", "ip daddr 10.0.0.0/8 accept", ""},
		{"ip daddr 10.1.2.3/8 accept", "ip daddr 10.0.0.0/8 accept", ""},
		{"meta iifname \"eth0\" accept", "iifname \"eth0\" accept", ""},
		{"iifname eth0 accept", "iifname \"eth0\" accept", ""},
		{"meta l4proto tcp dnat ip to 10.0.0.1:80", "meta l4proto tcp dnat to 10.0.0.1:80", ""},
		{"meta l4proto 17 accept", "meta l4proto udp accept", ""},
		{"accept # handle 7", "accept", ""},
		{"ip daddr { 10.0.0.1, 10.0.0.2, } accept", "ip daddr { 10.0.0.1, 10.0.0.2 } accept", ""},
		{"meta l4proto tcp dnat ip to numgen random mod 2 map @m", "meta l4proto tcp dnat ip to numgen random mod 2 offset 0 map @m", ""},
		{"dnat ip to ip daddr . tcp dport . numgen random mod 2 map @m", "meta l4proto tcp dnat ip to ip daddr . th dport . numgen random mod 2 map @m", ""},
	} {
		in := "add rule ip t c " + tc.in
		got, err := readAll(in, nil)
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		want := "1: add rule ip t c " + tc.want
		if tc.lossy != "" {
			want += " [lossy: " + tc.lossy + "]"
		}
		if len(got) != 1 || got[0] != want {
			t.Errorf("%s: read as %q, want %q", tc.in, got, want)
		}
		if _, err := Parse(in); (err != nil) != (tc.lossy != "") {
			t.Errorf("Parse(%q): error %v, want one only for lossy lines", in, err)
		}
	}
}

// TestReadNested reads the nested form: the table (with its comment) at
// its first line, each chain at its last declaration line, each set with
// its elements at its first line.
func TestReadNested(t *testing.T) {
	text := `table ip t { # handle 3
	comment "c"
	set s {
		type ipv4_addr
		flags interval
		elements = { 10.0.0.0/8,
			     192.0.2.1 }
	}
	chain in {
		type filter hook input priority filter; policy drop;
		comment "input"
		ip saddr @s accept
		counter packets 1 bytes 2 jump r
	}
	chain r {
	}
}
add rule ip t r return
delete rule ip t r handle 9
create chain ip t x
`
	got, err := readAll(text, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`1: add table ip t { comment "c" ; }`,
		`3: add set ip t s { type ipv4_addr ; flags interval ; } [set s (lines 3-8)]`,
		`3: add element ip t s { 10.0.0.0/8 } [set s (lines 3-8)]`,
		`3: add element ip t s { 192.0.2.1 } [set s (lines 3-8)]`,
		`11: add chain ip t in { type filter hook input priority 0 ; comment "input" ; } [policy drop]`,
		`12: add rule ip t in ip saddr @s accept`,
		`13: add rule ip t in counter jump r [lossy: counter values]`,
		`15: add chain ip t r`,
		`18: add rule ip t r return`,
		`19: delete rule ip t r [handle 9]`,
		`20: add chain ip t x [create]`,
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}

// TestReadTypedElements: with the set's definition, elements are read by
// its types (protocol numbers, endpoint maps, family and interval checks);
// without one, by their look.
func TestReadTypedElements(t *testing.T) {
	defs := map[string]*Set{
		"proto": {Name: "proto", Key: []DataType{TypeInetProto, TypeInetService}},
		"ep":    {Name: "ep", Endpoints: "TCP"},
		"svc":   {Name: "svc", Endpoints: "TCP", ByService: true},
		"addrs": {Name: "addrs", Key: []DataType{TypeIPv4Addr}},
		"vmap":  {Name: "vmap", Key: []DataType{TypeIPv4Addr}, Data: TypeVerdict},
	}
	lookup := func(f Family, table, name string) *Set { return defs[name] }
	for _, tc := range []struct{ in, want string }{
		{"add element ip t proto { 6 . 80, 17 . 53 }", "add element ip t proto { tcp . 80 }|add element ip t proto { udp . 53 }"},
		{"add element ip t ep { 1 : 10.0.0.1 . 80 }", "add element ip t ep { 1 : 10.0.0.1 . 80 }"},
		{"delete element ip t svc { 10.96.0.1 . 80 . 0 : 10.0.0.1 . 80 }", "delete element ip t svc { 10.96.0.1 . 80 . 0 : 10.0.0.1 . 80 }"},
		{"add element ip t addrs { 10.0.0.1 timeout 1h expires 59m }", "add element ip t addrs { 10.0.0.1 }"},
		{"delete element ip t vmap { 10.0.0.1 }", "delete element ip t vmap { 10.0.0.1 }"},
		{"add element ip t other { 10.0.0.1 . tcp . 80 : goto c }", "add element ip t other { 10.0.0.1 . tcp . 80 : goto c }"},
	} {
		got, err := readAll(tc.in, lookup)
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		for i := range got {
			got[i] = strings.SplitN(got[i], ": ", 2)[1]
			got[i] = strings.TrimSuffix(got[i], " [lossy: element timeout]")
		}
		if s := strings.Join(got, "|"); s != tc.want {
			t.Errorf("%s: read as %q, want %q", tc.in, s, tc.want)
		}
	}
	for _, tc := range []struct{ in, wantErr string }{
		{"add element ip t addrs { 10.0.0.0/8 }", "without flags interval"},
		{"add element ip t addrs { fd00::1 }", "is not an ipv4_addr"},
		{"add element ip t vmap { 10.0.0.1 }", "without a verdict"},
		{"add element ip t addrs { 10.0.0.1 : drop }", "element with a value"},
		{"add element ip t ep { 1 : fd00::1 . 80 }", `bad address "fd00::1"`},
		{"add element ip t svc { 1 : 10.0.0.1 . 80 }", `bad service address "1"`},
		{"flush element ip t addrs { 10.0.0.1 }", "flush element is not an operation"},
	} {
		_, err := readAll(tc.in, lookup)
		var pe *ParseError
		if !errors.As(err, &pe) || pe.Line != 1 || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: got %v, want a line 1 error containing %q", tc.in, err, tc.wantErr)
		}
	}
}

// TestReadApplyErrors: apply's errors come back as *ParseError naming the
// operation's line, prefixed with the nested block it came from; Read
// stops at the first.
func TestReadApplyErrors(t *testing.T) {
	text := "add table ip t\n\ntable ip t {\n\tset s {\n\t\ttype ipv4_addr\n\t}\n}\nadd chain ip t c\n"
	n := 0
	err := Read(text, nil, func(p *Parsed) error {
		n++
		if p.Op.Set != nil {
			return errors.New("refused")
		}
		return nil
	})
	var pe *ParseError
	if !errors.As(err, &pe) || pe.Line != 4 || pe.Text != "set s {" || pe.Err.Error() != "set s (lines 4-6): refused" {
		t.Fatalf("got %#v, want line 4 `set s (lines 4-6): refused`", err)
	}
	if n != 3 {
		t.Errorf("apply called %d times, want 3 (two tables, the set)", n)
	}
}

// TestParseRefuses: what a Transaction cannot hold.
func TestParseRefuses(t *testing.T) {
	for _, line := range []string{
		"create table ip t",
		"delete rule ip t c handle 4",
		"add chain ip t c { type filter hook input priority 0 ; policy drop ; }",
		"add set ip t s { type ipv4_addr ; size 10 ; }",
		"add element ip t s { 10.0.0.1 expires 1s }",
	} {
		if _, err := Parse(line); err == nil {
			t.Errorf("Parse(%q) succeeded, want an error", line)
		}
	}
}
