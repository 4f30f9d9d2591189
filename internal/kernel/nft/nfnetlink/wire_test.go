package nfnetlink

import (
	"bytes"
	"encoding/hex"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

var updateWire = flag.Bool("update-wire", false, "rewrite testdata/wire-*.txt from the current lowering")

// wireText prints the batch messages of a lowering, one per line, with
// the bookkeeping that maps kernel errors back to operations.
func wireText(msgs []nlMsg) string {
	var b strings.Builder
	for _, m := range msgs {
		fmt.Fprintf(&b, "type=%d flags=%#x family=%d op=%d", m.typ, m.flags, m.family, m.op)
		if len(m.elemOps) > 0 {
			fmt.Fprintf(&b, " elemOps=%v elemStarts=%v", m.elemOps, m.elemStarts)
		}
		if len(m.exprStmts) > 0 {
			fmt.Fprintf(&b, " exprStmts=%v exprStarts=%v", m.exprStmts, m.exprStarts)
		}
		fmt.Fprintf(&b, "\n  %s\n", hex.EncodeToString(m.attrs))
	}
	return b.String()
}

// TestLowerWire pins the exact bytes lowering sends for a transaction
// using every statement and kind of set, in both families, and for a
// later transaction on existing sets. The kernel tests check that these
// bytes make the same table as nft -f does; this test keeps a change of
// the encoder (kproxy encodes expressions itself, for speed) from
// changing them unnoticed. Regenerate with -update-wire only when the
// kernel tests pass with the new bytes.
func TestLowerWire(t *testing.T) {
	for _, fam := range []nft.Family{nft.IPv4, nft.IPv6} {
		t.Run(string(fam), func(t *testing.T) {
			a := nft.SampleAddrsFor(fam)
			first := nft.Sample(a)
			second := nft.NewTransaction(fam, nft.SampleTable)
			second.Insert(&nft.Rule{Chain: "service-1", Stmts: []nft.Stmt{nft.MatchNumgen{Mod: 2, Value: 0}, nft.Verdict{Kind: nft.Goto, Chain: "endpoint-3"}}})
			second.Add(&nft.Element{Set: "nodeport-ips", Key: []nft.Value{{Prefix: a.PodNet}}})
			second.Delete(&nft.Element{Set: "service-ips", Key: []nft.Value{{Addr: a.Svc2}, {Proto: v1.ProtocolUDP}, {Port: 53}}})
			second.In("other").Add(&nft.Rule{Chain: "c", Stmts: []nft.Stmt{nft.DNAT{Proto: v1.ProtocolSCTP, To: netip.AddrPortFrom(a.Pod2, 9)}}, Comment: "other table"})
			second.Insert(&nft.Rule{Chain: "service-2", Stmts: []nft.Stmt{nft.DNATMap{Proto: v1.ProtocolTCP, Mod: 1, Offset: 7, Map: "endpoints-0"}}})
			second.Add(&nft.Element{Set: "endpoints-0", Index: 7, To: netip.AddrPortFrom(a.Pod2, 53)})
			second.Delete(&nft.Element{Set: "endpoints-0", Index: 1, To: netip.AddrPortFrom(a.Pod2, 80)})
			second.Add(&nft.Rule{Chain: "cluster-tcp-2", Stmts: []nft.Stmt{nft.DNATByService{Proto: v1.ProtocolTCP, Mod: 7, Map: "cluster-endpoints-tcp"}}})
			second.Delete(&nft.Element{Set: "cluster-endpoints-tcp", Key: []nft.Value{{Addr: a.Svc1}, {Port: 8080}}, Index: 1, To: netip.AddrPortFrom(a.Pod2, 65535)})
			second.Add(&nft.Element{Set: "cluster-endpoints-tcp", Key: []nft.Value{{Addr: a.Svc1}, {Port: 8080}}, Index: 6, To: netip.AddrPortFrom(a.Pod1, 8081)})
			view := fakeView{
				nft.SampleTable + " nodeport-ips":          {Name: "nodeport-ips", Key: []nft.DataType{nft.AddrType(fam)}, Interval: true},
				nft.SampleTable + " service-ips":           {Name: "service-ips", Key: []nft.DataType{nft.AddrType(fam), nft.TypeInetProto, nft.TypeInetService}, Data: nft.TypeVerdict},
				nft.SampleTable + " endpoints-0":           {Name: "endpoints-0", Endpoints: v1.ProtocolTCP},
				nft.SampleTable + " cluster-endpoints-tcp": {Name: "cluster-endpoints-tcp", Endpoints: v1.ProtocolTCP, ByService: true},
			}
			var got strings.Builder
			for i, c := range []struct {
				tx   *nft.Transaction
				view kernelView
			}{{first, nil}, {second, view}} {
				l := newLowerer(c.tx, c.view)
				if err := l.lower(); err != nil {
					t.Fatal(err)
				}
				fmt.Fprintf(&got, "# transaction %d\n%s", i+1, wireText(l.msgs))
			}
			path := filepath.Join("testdata", "wire-"+string(fam)+".txt")
			if *updateWire {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(got.String()), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(string(want), got.String()); d != "" {
				t.Errorf("lowering differs from %s (-want +got):\n%s", path, d)
			}
		})
	}
}

// TestFramedBatchIsTheCopiedOne: the batch sent from the lowerer's arena
// (messages framed in place, one buffer per run of them) is byte for byte
// the batch copied message by message into one buffer, and a large one
// goes in a few buffers, not one per message.
func TestFramedBatchIsTheCopiedOne(t *testing.T) {
	tx := largeTx() // 5000 services: ~25k operations
	l := newLowerer(tx, nil)
	if err := l.lower(); err != nil {
		t.Fatal(err)
	}
	copied := make([]nlMsg, len(l.msgs))
	for i, m := range l.msgs {
		m.wire = nil
		copied[i] = m
	}
	for _, check := range []bool{false, true} {
		framedConn, copyConn := &nlConn{seq: 41}, &nlConn{seq: 41}
		bufs, size := framedConn.frameBatch(l.msgs, check)
		one, oneSize := copyConn.frameBatch(copied, check)
		if len(one) != 2-b2i(check) {
			t.Fatalf("check=%v: unframed messages in %d buffers, want them copied into one (plus the end)", check, len(one))
		}
		got, want := bytes.Join(bufs, nil), bytes.Join(one, nil)
		if !bytes.Equal(got, want) {
			t.Fatalf("check=%v: framed batch (%d bytes) differs from the copied one (%d bytes)", check, len(got), len(want))
		}
		if size != len(got) || oneSize != len(want) {
			t.Errorf("check=%v: sizes %d and %d, bytes %d", check, size, oneSize, len(want))
		}
		if framedConn.seq != copyConn.seq || framedConn.seq != 41+uint32(len(l.msgs))+2 {
			t.Errorf("check=%v: sequence numbers end at %d and %d, want %d", check, framedConn.seq, copyConn.seq, 41+len(l.msgs)+2)
		}
		// A buffer per arena block (256 KiB) or so, and a message's
		// bytes are not copied: the buffers point into the arena.
		if blocks := size/arenaChunk + 1; len(bufs) > 2*blocks+2 || len(bufs) < 3 {
			t.Fatalf("check=%v: %d messages (%d bytes) in %d buffers, want about %d", check, len(l.msgs), size, len(bufs), blocks+2)
		}
		if &bufs[1][0] != &l.msgs[0].wire[0] {
			t.Errorf("check=%v: the first message was copied", check)
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
