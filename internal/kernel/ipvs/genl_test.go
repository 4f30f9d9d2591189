package ipvs

import (
	"encoding/binary"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

func TestServiceAttrBytes(t *testing.T) {
	if nl.NativeEndian() != binary.LittleEndian {
		t.Skip("the expected bytes are written for a little-endian host")
	}
	// IPVS_CMD_ATTR_SERVICE { AF=AF_INET, PROTOCOL=TCP, ADDR=10.96.0.1 (16
	// bytes), PORT=443 (network order) }, each attribute padded to 4.
	want := []byte{
		48, 0, 1, 0, // nested, 48 bytes, type 1
		6, 0, 1, 0, 2, 0, 0, 0, // AF: u16 2
		6, 0, 2, 0, 6, 0, 0, 0, // PROTOCOL: u16 6
		20, 0, 3, 0, 10, 96, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // ADDR
		6, 0, 4, 0, 0x01, 0xbb, 0, 0, // PORT: be16 443
	}
	got := serviceAttr(tcp("10.96.0.1", 443)).Serialize()
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("bytes (-want +got):\n%s", d)
	}
}

func TestServiceRoundTrip(t *testing.T) {
	tests := []VirtualServer{
		{Family: unix.AF_INET, Protocol: protoTCP, Addr: a("10.96.0.1"), Port: 443},
		{Family: unix.AF_INET6, Protocol: protoUDP, Addr: a("fd00:96::a"), Port: 53},
		{Family: unix.AF_INET, Protocol: protoSCTP, Addr: a("192.168.1.5"), Port: 30999},
		{Family: unix.AF_INET, FWMark: 0x4000},
	}
	for _, vs := range tests {
		// A dump message is the generic netlink header, then the
		// attribute; the kernel sends more attributes (scheduler, flags,
		// stats), which parsing skips.
		attr := serviceAttr(vs)
		attr.AddRtAttr(6, nl.ZeroTerminated("rr"))
		msg := append((&nl.Genlmsg{Command: 1, Version: 1}).Serialize(), attr.Serialize()...)
		got, ok, err := parseServiceMessage(msg)
		if err != nil || !ok {
			t.Fatalf("%v: parse = %v, %v", vs, ok, err)
		}
		if d := cmp.Diff(vs, got, equateAddrs); d != "" {
			t.Errorf("round trip (-want +got):\n%s", d)
		}
	}
	if _, ok, err := parseServiceMessage([]byte{1, 1, 0, 0}); ok || err != nil {
		t.Errorf("message without a service: ok=%v err=%v", ok, err)
	}
	if _, _, err := parseServiceMessage([]byte{1}); err == nil {
		t.Error("short message: no error")
	}
}
