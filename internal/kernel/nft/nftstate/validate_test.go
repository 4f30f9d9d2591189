package nftstate

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

// verdictMapTable is a NAT base chain whose rules name one verdict map
// of n elements, each a goto to a chain of its own, and one element that
// drops.
func verdictMapTable(rules, n int) string {
	var b strings.Builder
	b.WriteString("add table ip t\nadd chain ip t base { type nat hook prerouting priority -100 ; }\n")
	b.WriteString("add map ip t m { type ipv4_addr : verdict ; }\n")
	for i := range n {
		fmt.Fprintf(&b, "add chain ip t s%d\nadd rule ip t s%d accept\n", i, i)
		fmt.Fprintf(&b, "add element ip t m { 10.0.%d.%d : goto s%d }\n", i/250, i%250+1, i)
	}
	b.WriteString("add element ip t m { 10.1.0.1 : drop }\n")
	for range rules {
		b.WriteString("add rule ip t base ip daddr vmap @m\n")
	}
	return b.String()
}

// TestValidateVerdictMap: the walk through a verdict map's jumps still
// finds a loop, and jumpElems sorts a map's jump and goto elements once
// per validation, leaving other verdicts out.
func TestValidateVerdictMap(t *testing.T) {
	st := &State{}
	if err := run(st, Netlink, verdictMapTable(3, 20)); err != nil {
		t.Fatal(err)
	}
	loop := "add chain ip t back\nadd element ip t m { 10.2.0.1 : goto back }\nadd rule ip t back ip daddr vmap @m\n"
	if err := run(st, Netlink, loop); err == nil || !strings.Contains(err.Error(), "loop") {
		t.Errorf("a loop through the map: got %v, want it refused as a loop", err)
	}

	x := st.Begin(Netlink, 1)
	x.t = st.Table(nft.IPv4, "t")
	x.sortedMaps = map[string][]*Element{}
	s := x.t.Sets["m"]
	got := x.jumpElems("m", s)
	if len(got) != 20 {
		t.Fatalf("%d jump elements, want 20 (the drop left out)", len(got))
	}
	for i := 1; i < len(got); i++ {
		if got[i-1].ID() >= got[i].ID() {
			t.Errorf("elements not in ID order: %s before %s", KeyText(got[i-1].Key()), KeyText(got[i].Key()))
		}
	}
	elems := s.Elems
	s.Elems = nil
	if again := x.jumpElems("m", s); len(again) != 20 {
		t.Errorf("second call within one validation: %d elements, want the 20 sorted before", len(again))
	}
	s.Elems = elems
}

// BenchmarkValidateVerdictMap: a commit of a table whose base chain
// names a map of 2,000 gotos from 8 rules (kproxy's service map is
// named from several base chains).
func BenchmarkValidateVerdictMap(b *testing.B) {
	st := &State{}
	if err := run(st, Netlink, verdictMapTable(8, 2000)); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := run(st, Netlink, "add element ip t m { 10.3.0.1 : drop }\ndelete element ip t m { 10.3.0.1 }\n"); err != nil {
			b.Fatal(err)
		}
	}
}
