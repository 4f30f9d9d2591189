package ipset

import (
	"errors"
	"testing"
)

func TestCanonical(t *testing.T) {
	for _, c := range []struct {
		typ  string
		v6   bool
		in   string
		want string // "" for ErrBadEntry
	}{
		{"hash:ip", false, "198.19.0.1", "198.19.0.1"},
		{"hash:ip", true, "FD00:19:0::1", "fd00:19::1"},
		{"hash:ip", false, "fd00::1", ""},
		{"hash:ip", true, "198.19.0.1", ""},
		{"hash:ip", false, "::ffff:198.19.0.1", ""},
		{"hash:ip", false, "198.19.0.1,tcp:80", ""},
		{"hash:ip,port", false, "198.19.0.1,tcp:80", "198.19.0.1,tcp:80"},
		{"hash:ip,port", false, "198.19.0.1,udp:53", "198.19.0.1,udp:53"},
		{"hash:ip,port", true, "fd00::1,sctp:3868", "fd00::1,sctp:3868"},
		{"hash:ip,port", false, "198.19.0.1,tcp:65536", ""},
		{"hash:ip,port", false, "198.19.0.1,icmp:8", ""},
		{"hash:ip,port", false, "198.19.0.1,80", ""},
		{"hash:ip,port", false, "198.19.0.1", ""},
		{"hash:ip,port,ip", false, "198.19.0.1,tcp:80,198.18.0.5", "198.19.0.1,tcp:80,198.18.0.5"},
		{"hash:ip,port,ip", false, "198.19.0.1,tcp:80,198.18.0.0/24", ""},
		{"hash:ip,port,ip", true, "fd00::1,tcp:80,198.18.0.5", ""},
		{"hash:ip,port,net", false, "198.19.0.1,tcp:80,198.18.0.7/24", "198.19.0.1,tcp:80,198.18.0.0/24"},
		{"hash:ip,port,net", false, "198.19.0.1,tcp:80,198.18.0.5/32", "198.19.0.1,tcp:80,198.18.0.5"},
		{"hash:ip,port,net", false, "198.19.0.1,tcp:80,198.18.0.5", "198.19.0.1,tcp:80,198.18.0.5"},
		{"hash:ip,port,net", true, "fd00::1,udp:53,fd00:18::/64", "fd00::1,udp:53,fd00:18::/64"},
		{"hash:ip,port,net", false, "198.19.0.1,tcp:80,0.0.0.0/0", ""},
		{"hash:net", false, "198.18.0.0/16", "198.18.0.0/16"},
		{"hash:net", false, "198.18.0.9/32", "198.18.0.9"},
		{"hash:net", true, "fd00:18::1/128", "fd00:18::1"},
		{"hash:net", false, "198.18.0.0/33", ""},
		{"bitmap:port", false, "30080", "30080"},
		{"bitmap:port", false, "0", "0"},
		{"bitmap:port", false, "tcp:30080", ""},
		{"bitmap:port", false, "-1", ""},
		{"hash:mac", false, "00:11:22:33:44:55", ""},
	} {
		got, err := Canonical(c.typ, c.v6, c.in)
		if c.want == "" {
			if !errors.Is(err, ErrBadEntry) {
				t.Errorf("Canonical(%s, v6=%v, %q) = %q, %v; want ErrBadEntry", c.typ, c.v6, c.in, got, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("Canonical(%s, v6=%v, %q) = %q, %v; want %q", c.typ, c.v6, c.in, got, err, c.want)
		}
	}
}

func TestCheckSet(t *testing.T) {
	for _, s := range []Set{
		{Name: "", Type: "hash:ip"},
		{Name: "KUBE-6-LOAD-BALANCER-SOURCE-CIDR", Type: "hash:ip,port,net"}, // 32 bytes
		{Name: "X", Type: "hash:mac"},
		{Name: "X", Type: "bitmap:port", IPv6: true},
	} {
		if err := CheckSet(s); !errors.Is(err, ErrBadSet) {
			t.Errorf("CheckSet(%+v) = %v, want ErrBadSet", s, err)
		}
	}
	if err := CheckSet(Set{Name: "KUBE-6-LOAD-BALANCER-SOURCE-CID", Type: "hash:ip,port,net", IPv6: true}); err != nil {
		t.Error(err)
	}
}
