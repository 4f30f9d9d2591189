package nfacct

// Kernel test: as root, in fresh network namespaces; the only traffic is
// UDP from a namespace to its own 127.0.0.1.

import (
	"errors"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/testutil/netns"
)

func TestParseCounter(t *testing.T) {
	// An NFNL_MSG_ACCT_NEW payload as the kernel sends it: nfgenmsg, then
	// NFACCT_NAME "x", NFACCT_PKTS 3 and NFACCT_BYTES 0x0102 (big-endian,
	// NLA_F_NET_BYTEORDER not set, as the kernel writes them).
	msg := []byte{
		0, 0, 0, 0, // nfgenmsg
		6, 0, 1, 0, 'x', 0, 0, 0, // name, padded to 4
		12, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 3,
		12, 0, 3, 0, 0, 0, 0, 0, 0, 0, 1, 2,
	}
	c, err := parseCounter(msg)
	if err != nil {
		t.Fatal(err)
	}
	if c != (Counter{Name: "x", Packets: 3, Bytes: 0x0102}) {
		t.Errorf("parsed %+v", c)
	}
	if _, err := parseCounter(msg[:2]); err == nil {
		t.Error("a message shorter than its header parsed")
	}
	bad := append([]byte{}, msg[:12]...)
	bad = append(bad, 8, 0, 2, 0, 0, 0, 0, 3) // a 4-byte count
	if _, err := parseCounter(bad); err == nil {
		t.Error("a 4-byte count parsed")
	}
}

func TestNames(t *testing.T) {
	for _, name := range []string{"", "a-name-of-thirty-two-characters!"} {
		if err := (Netlink{}).Ensure(name); err == nil {
			t.Errorf("Ensure(%q) accepted the name", name)
		}
		if err := (&Fake{}).Ensure(name); err == nil {
			t.Errorf("Fake.Ensure(%q) accepted the name", name)
		}
	}
}

// TestKernel creates a counter, has an iptables rule count real packets in
// it, and checks that the counter belongs to its namespace and that
// Ensure keeps its counts.
func TestKernel(t *testing.T) {
	// iptables-nft: no xtables lock, which iptables-legacy shares with
	// every other namespace of the host (and waits for).
	netns.Require(t, "iptables-nft", "bash")
	ns := netns.New(t, netns.RandomID(4), "nfacct")
	other := netns.New(t, netns.RandomID(4), "nfacct-other")
	k := Netlink{NetNSPath: "/run/netns/" + ns.Name}
	const name = "kproxy_test_pkts"

	if _, err := k.Get(name); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get before Ensure: %v, want ErrNotFound", err)
	}
	if err := k.Ensure(name); err != nil {
		t.Fatal(err)
	}
	c, err := k.Get(name)
	if err != nil || c != (Counter{Name: name}) {
		t.Fatalf("Get after Ensure = %+v, %v; want zero counts", c, err)
	}
	if _, err := (Netlink{NetNSPath: "/run/netns/" + other.Name}).Get(name); !errors.Is(err, ErrNotFound) {
		t.Errorf("the counter is visible in another namespace: %v", err)
	}

	if out, err := ns.Exec(10*time.Second, "ip", "link", "set", "lo", "up"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if out, err := ns.Exec(30*time.Second, "iptables-nft", "-A", "OUTPUT", "-o", "lo", "-p", "udp", "--dport", "9",
		"-m", "nfacct", "--nfacct-name", name); err != nil {
		t.Fatalf("the kernel refused a rule naming the counter: %v: %s", err, out)
	}
	const sent = 3
	for range sent {
		if out, err := ns.Exec(10*time.Second, "bash", "-c", "echo probe >/dev/udp/127.0.0.1/9"); err != nil {
			t.Fatalf("sending: %v: %s", err, out)
		}
	}
	if c, err = k.Get(name); err != nil || c.Packets != sent || c.Bytes == 0 {
		t.Fatalf("after %d packets: %+v, %v", sent, c, err)
	}
	if err := k.Ensure(name); err != nil {
		t.Fatalf("Ensure of an existing counter: %v", err)
	}
	if c, err = k.Get(name); err != nil || c.Packets != sent {
		t.Errorf("Ensure reset the counts: %+v, %v", c, err)
	}
}

func TestFake(t *testing.T) {
	f := &Fake{}
	if _, err := f.Get("a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get before Ensure: %v", err)
	}
	if err := f.Ensure("a"); err != nil {
		t.Fatal(err)
	}
	f.Counters["a"].Packets = 5
	if err := f.Ensure("a"); err != nil {
		t.Fatal(err)
	}
	if c, err := f.Get("a"); err != nil || c.Packets != 5 {
		t.Errorf("Get = %+v, %v; want 5 packets kept", c, err)
	}
}
