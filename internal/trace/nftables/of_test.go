package nftables

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kproxy/kproxy/internal/kernel/nft/nfttest"
	"github.com/kproxy/kproxy/internal/trace"
)

// TestTraceOfFake: the tracer walks nfttest.Fake's state (Of) as it
// walks the state it builds from the same text itself: one in-memory
// nf_tables, whoever filled it. Every packet of TestTraceServices gives
// the same report, paths included.
func TestTraceOfFake(t *testing.T) {
	rules := join(baseV4, svcA, svcB)
	fake := nfttest.New()
	if err := fake.Load(rules); err != nil {
		t.Fatal(err)
	}
	fromFake := Of(fake.State())
	fromText, err := ParseNFT(rules)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []trace.Packet{
		pkt(tcp, "10.180.1.7:40000", "10.96.0.10:80", "cali1"),
		pkt(tcp, "203.0.113.5:40000", "10.96.0.10:80", "eth0"),
		pkt(tcp, "10.180.1.1:40000", "10.96.0.10:80", "cali1"),
		pkt(tcp, "203.0.113.5:40000", "10.0.0.10:30080", "eth0"),
		pkt(tcp, "10.0.0.10:40000", "10.0.0.10:30080", ""),
		pkt(tcp, "10.180.1.7:40000", "10.96.0.20:80", "cali1"),
		pkt(udp, "10.180.1.7:40000", "10.96.0.20:53", "cali1"),
		pkt(tcp, "203.0.113.5:40000", "10.0.0.10:30020", "eth0"),
		pkt(tcp, "10.180.1.7:40000", "10.96.0.10:81", "cali1"),
	} {
		want, err := fromText.Trace(p, node4)
		if err != nil {
			t.Fatal(err)
		}
		got, err := fromFake.Trace(p, node4)
		if err != nil {
			t.Fatal(err)
		}
		if len(want.Outcomes) == 0 {
			t.Fatalf("%s: no outcomes", p)
		}
		if d := cmp.Diff(want.String(), got.String()); d != "" {
			t.Errorf("%s: the fake's state traces differently (-text +fake):\n%s", p, d)
		}
	}
}
