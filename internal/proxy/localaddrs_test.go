package proxy

import (
	"net/netip"
	"slices"
	"testing"
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
