package nft

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	v1 "k8s.io/api/core/v1"
)

var cmpTx = cmp.Options{
	cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{}, netip.AddrPort{}),
	cmpopts.IgnoreFields(Table{}, "Family", "Name"),
}

func TestParseRoundTrip(t *testing.T) {
	small := NewTransaction(IPv4, "t")
	small.Add(&Table{})
	small.Flush(&Table{})
	small.Flush(&Chain{Name: "c"})
	small.Delete(&Chain{Name: "c"})
	small.Flush(&Set{Name: "s"})
	small.Delete(&Set{Name: "m", Data: TypeVerdict})
	small.Delete(&Element{Set: "m", Key: []Value{{Addr: netip.MustParseAddr("10.0.0.1")}, {Proto: v1.ProtocolTCP}, {Port: 80}}})
	small.Delete(&Element{Set: "e", Index: 4000000000, To: netip.MustParseAddrPort("10.0.0.2:8080")})
	small.Delete(&Element{Set: "k", Key: []Value{{Addr: netip.MustParseAddr("10.0.0.1")}, {Port: 80}}, Index: 4000000000, To: netip.MustParseAddrPort("10.0.0.2:8080")})
	small.Add(&Set{Name: "d", Key: []DataType{TypeIPv4Addr}, Dynamic: true, Timeout: 90 * time.Minute})
	small.Add(&Rule{Chain: "c", Stmts: []Stmt{MatchIifname{Name: `we"ird`}, Verdict{Kind: Accept}}, Comment: `a "quoted", comment`})
	small.Delete(&Table{})

	multi := NewTransaction(IPv4, "t")
	multi.Add(&Table{})
	multi.In("t-s0").Add(&Table{})
	multi.In("t-s0").Add(&Chain{Name: "c"})
	multi.Add(&Chain{Name: "c"})
	multi.In("t-s0").AddRules(&Rule{Chain: "c", Stmts: []Stmt{Verdict{Kind: Accept}}})
	multi.In("t-s1").Delete(&Table{})

	for name, tx := range map[string]*Transaction{
		"ip":    Sample(SampleAddrsFor(IPv4)),
		"ip6":   Sample(SampleAddrsFor(IPv6)),
		"small": small,
		"multi": multi,
	} {
		t.Run(name, func(t *testing.T) {
			text := tx.String()
			got, err := Parse(text)
			if err != nil {
				t.Fatalf("Parse: %v\n%s", err, text)
			}
			if len(got) != 1 {
				t.Fatalf("got %d transactions, want 1", len(got))
			}
			if d := cmp.Diff(tx, got[0], cmpTx); d != "" {
				t.Errorf("round trip (-want +got):\n%s", d)
			}
			if got[0].String() != text {
				t.Errorf("text changed after a round trip")
			}
		})
	}
}

func TestParseSplitsFamilies(t *testing.T) {
	// One transaction per run of lines of one family, whatever their
	// tables: a multi-table transaction reads back as one.
	text := "add table ip a\n\n# comment\nadd chain ip a c\nadd table ip b\nadd chain ip a d\nadd table ip6 a\nadd table ip a\n"
	txs, err := Parse(text)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, tx := range txs {
		s := string(tx.Family) + " " + tx.Table
		for i := range tx.Ops {
			s += " " + tx.TableOf(&tx.Ops[i])
		}
		got = append(got, s)
	}
	want := []string{"ip a a a b a", "ip6 a a", "ip a a"}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}

func TestParseErrors(t *testing.T) {
	for _, line := range []string{
		"add table inet t",
		"add rule ip t c tcp sport 80",
		"add rule ip t c jump",
		"add set ip t s { type ipv4_addr ; flags constant ; }",
		"add map ip t s { type ipv4_addr ; }",
		"add element ip t s { 10.0.0.1 : jump }",
		"add rule ip t c iifname \"eth0",
		"add rule ip t c ip6 daddr fd00::1 accept",
		"delete rule ip t c accept",
		"add chain ip t c { type nat hook prerouting priority x ; }",
		"add table ip t { comment \"x\" ; } extra",
	} {
		if _, err := Parse(line); err == nil {
			t.Errorf("Parse(%q) succeeded, want an error", line)
		}
	}
}
