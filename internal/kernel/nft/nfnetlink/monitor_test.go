package nfnetlink

import (
	"encoding/binary"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

// notification frames one nf_tables notification as the kernel sends it,
// with the sender's port id in the header.
func notification(msg uint16, family uint8, port uint32, fill func(a *attrs)) []byte {
	var a attrs
	fill(&a)
	b := appendMsg(nil, nftType(msg), 0, 7, family, 0, a.b)
	binary.NativeEndian.PutUint32(b[12:16], port)
	return b
}

func TestDecodeEvents(t *testing.T) {
	var dgram []byte
	dgram = append(dgram, notification(unix.NFT_MSG_DELTABLE, unix.NFPROTO_IPV4, 100, func(a *attrs) {
		a.str(unix.NFTA_TABLE_NAME, "kube-proxy")
	})...)
	dgram = append(dgram, notification(unix.NFT_MSG_NEWCHAIN, unix.NFPROTO_IPV6, 101, func(a *attrs) {
		a.str(unix.NFTA_CHAIN_TABLE, "kube-proxy")
		a.str(unix.NFTA_CHAIN_NAME, "services")
	})...)
	dgram = append(dgram, notification(unix.NFT_MSG_DELRULE, unix.NFPROTO_IPV4, 102, func(a *attrs) {
		a.str(unix.NFTA_RULE_TABLE, "kube-proxy-s3")
		a.str(unix.NFTA_RULE_CHAIN, "nat-prerouting")
	})...)
	dgram = append(dgram, notification(unix.NFT_MSG_DELSET, unix.NFPROTO_IPV4, 103, func(a *attrs) {
		a.str(unix.NFTA_SET_TABLE, "kube-proxy")
		a.str(unix.NFTA_SET_NAME, "service-ips")
		a.put(unix.NFTA_SET_FLAGS, binary.BigEndian.AppendUint32(nil, unix.NFT_SET_MAP))
	})...)
	dgram = append(dgram, notification(unix.NFT_MSG_NEWSET, unix.NFPROTO_IPV4, 103, func(a *attrs) {
		a.str(unix.NFTA_SET_TABLE, "kube-proxy")
		a.str(unix.NFTA_SET_NAME, "cluster-ips")
	})...)
	dgram = append(dgram, notification(unix.NFT_MSG_DELSETELEM, unix.NFPROTO_IPV4, 104, func(a *attrs) {
		a.str(unix.NFTA_SET_ELEM_LIST_TABLE, "kube-proxy")
		a.str(unix.NFTA_SET_ELEM_LIST_SET, "service-ips")
		a.nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(a *attrs) {
			a.nest(unix.NFTA_LIST_ELEM, func(a *attrs) { a.u32(1, 0) })
			a.nest(unix.NFTA_LIST_ELEM, func(a *attrs) { a.u32(1, 0) })
		})
	})...)
	// Generations and other subsystems are skipped.
	dgram = append(dgram, notification(unix.NFT_MSG_NEWGEN, unix.NFPROTO_UNSPEC, 104, func(a *attrs) { a.u32(unix.NFTA_GEN_ID, 9) })...)
	other := appendMsg(nil, unix.NFNL_SUBSYS_CTNETLINK<<8|1, 0, 1, unix.NFPROTO_IPV4, 0, nil)
	dgram = append(dgram, other...)

	got, err := DecodeEvents(dgram)
	if err != nil {
		t.Fatal(err)
	}
	want := []nft.Event{
		{Family: nft.IPv4, Kind: nft.KindTable, Deleted: true, Table: "kube-proxy", Count: 1, PortID: 100},
		{Family: nft.IPv6, Kind: nft.KindChain, Table: "kube-proxy", Name: "services", Count: 1, PortID: 101},
		{Family: nft.IPv4, Kind: nft.KindRule, Deleted: true, Table: "kube-proxy-s3", Name: "nat-prerouting", Count: 1, PortID: 102},
		{Family: nft.IPv4, Kind: nft.KindMap, Deleted: true, Table: "kube-proxy", Name: "service-ips", Count: 1, PortID: 103},
		{Family: nft.IPv4, Kind: nft.KindSet, Table: "kube-proxy", Name: "cluster-ips", Count: 1, PortID: 103},
		{Family: nft.IPv4, Kind: nft.KindElement, Deleted: true, Table: "kube-proxy", Name: "service-ips", Count: 2, PortID: 104},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("events (-want +got):\n%s", d)
	}

	// Skipped port ids (kproxy's own sockets) are dropped undecoded; the
	// others keep their order.
	got, err = decodeEvents(dgram, func(p uint32) bool { return p == 101 || p == 103 })
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]nft.Event{want[0], want[2], want[5]}, got); d != "" {
		t.Errorf("events without ports 101 and 103 (-want +got):\n%s", d)
	}

	// A truncated datagram is an error, with what came before it.
	got, err = DecodeEvents(dgram[:len(dgram)-3])
	if err == nil {
		t.Errorf("truncated datagram: no error")
	}
	if len(got) != len(want) {
		t.Errorf("truncated datagram: %d events before the error, want %d", len(got), len(want))
	}
}
