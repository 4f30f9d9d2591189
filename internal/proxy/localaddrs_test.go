package proxy

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/model"
)

// TestLocalAddrsExcept: every interface's addresses, loopback's 127.0.0.1
// among them, unless its interface is the one skipped.
func TestLocalAddrsExcept(t *testing.T) {
	loopback := netip.MustParseAddr("127.0.0.1")
	all, err := LocalAddrs()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(all, loopback) {
		t.Skipf("no 127.0.0.1 in this network namespace: %v", all)
	}
	rest, err := LocalAddrsExcept("lo")
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(rest, loopback) {
		t.Errorf("127.0.0.1 listed with lo skipped: %v", rest)
	}
	for _, a := range rest {
		if !slices.Contains(all, a) {
			t.Errorf("%s listed with lo skipped but not without", a)
		}
	}
}

// TestNodePortHostAddrs: the host's addresses when there is a host to
// ask (its error wrapped), else the Node's, else none.
func TestNodePortHostAddrs(t *testing.T) {
	host := []netip.Addr{netip.MustParseAddr("198.18.0.7")}
	node := &model.Node{Name: "n", Addresses: []netip.Addr{netip.MustParseAddr("198.18.0.1")}}
	read := func() ([]netip.Addr, error) { return host, nil }
	if got, err := NodePortHostAddrs(read, node); err != nil || !slices.Equal(got, host) {
		t.Errorf("with a host: %v, %v; want %v", got, err, host)
	}
	if got, err := NodePortHostAddrs(nil, node); err != nil || !slices.Equal(got, node.Addresses) {
		t.Errorf("no host: %v, %v; want the Node's %v", got, err, node.Addresses)
	}
	if got, err := NodePortHostAddrs(nil, nil); err != nil || got != nil {
		t.Errorf("no host, no Node: %v, %v; want none", got, err)
	}
	boom := errors.New("boom")
	_, err := NodePortHostAddrs(func() ([]netip.Addr, error) { return nil, boom }, node)
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "nodePortAddresses") {
		t.Errorf("failing read: %v; want it wrapped", err)
	}
}
