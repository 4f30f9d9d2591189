package savedstate

// Address plan: 198.18.0.0/16 nodes and pods, 198.19.0.0/16 service IPs,
// fd00::/8 IPv6. The texts are in the shapes the tools print: ipvsadm
// 1.31's -Ln (as upstream's pkg/proxy/ipvs/README.md shows it) and -S -n
// (what `ipvsadm -R` restores), ipset 7's save.

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/trace"
)

const ipvsadmLn = `IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn
TCP  198.19.0.1:443 rr persistent 10800
  -> 198.18.0.10:6443             Masq    1      0          0
TCP  198.19.0.10:53 rr
  -> 198.18.129.53:53             Masq    1      0          0
  -> 198.18.130.53:53             Masq    0      3          1
UDP  198.19.0.10:53 rr
  -> 198.18.129.53:53             Masq    1      0          0
FWM  1 rr
  -> 198.18.9.9:0                 Route   1      0          0
TCP  [fd00:19::17]:80 mh (sh-port)
  -> [fd00:18:1:a::50]:8080       Masq    1      0          0
`

const ipvsadmS = `-A -t 198.19.0.1:443 -s rr -p 10800
-a -t 198.19.0.1:443 -r 198.18.0.10:6443 -m -w 1
-A -t 198.19.0.10:53 -s rr
-a -t 198.19.0.10:53 -r 198.18.129.53:53 -m -w 1
-a -t 198.19.0.10:53 -r 198.18.130.53:53 -m -w 0
-A -u 198.19.0.10:53 -s rr
-a -u 198.19.0.10:53 -r 198.18.129.53:53 -m -w 1
-A -f 1 -s rr
-a -f 1 -r 198.18.9.9:0 -g -w 1
-A -t [fd00:19::17]:80 -s mh -b sh-port
-a -t [fd00:19::17]:80 -r [fd00:18:1:a::50]:8080 -m -w 1
`

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// TestParseIPVSAdm: -S -n and -Ln of the same table read alike.
func TestParseIPVSAdm(t *testing.T) {
	want := []trace.IPVSService{
		{Proto: v1.ProtocolTCP, Addr: ap("198.19.0.1:443"), Scheduler: "rr", Persistent: true, Timeout: 10800,
			Reals: []trace.IPVSReal{{Addr: ap("198.18.0.10:6443"), Weight: 1, Method: "masq"}}},
		{Proto: v1.ProtocolTCP, Addr: ap("198.19.0.10:53"), Scheduler: "rr",
			Reals: []trace.IPVSReal{{Addr: ap("198.18.129.53:53"), Weight: 1, Method: "masq"}, {Addr: ap("198.18.130.53:53"), Weight: 0, Method: "masq"}}},
		{Proto: v1.ProtocolUDP, Addr: ap("198.19.0.10:53"), Scheduler: "rr",
			Reals: []trace.IPVSReal{{Addr: ap("198.18.129.53:53"), Weight: 1, Method: "masq"}}},
		{Proto: v1.ProtocolTCP, Addr: ap("[fd00:19::17]:80"), Scheduler: "mh", Flags: []string{"sh-port"},
			Reals: []trace.IPVSReal{{Addr: ap("[fd00:18:1:a::50]:8080"), Weight: 1, Method: "masq"}}},
	}
	for name, text := range map[string]string{"-Ln": ipvsadmLn, "-S -n": ipvsadmS} {
		got, err := ParseIPVSAdm(text)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\n got %+v\nwant %+v", name, got, want)
		}
	}
	for _, bad := range []string{
		"-a -t 198.19.0.1:443 -r 198.18.0.10:6443 -m -w 1\n", // no -A before
		"-A -t 198.19.0.1 -s rr\n",                           // no port
		"-A -t 198.19.0.1:80 -s rr\n-A -t 198.19.0.1:80 -s rr\n",
		"TCP  198.19.0.1:80 rr\n  -> 198.18.0.1:80 Masq x 0 0\n",
		"  -> 198.18.0.1:80 Masq 1 0 0\n",
		"-A -t 198.19.0.1:80 -s rr --bogus\n",
	} {
		if _, err := ParseIPVSAdm(bad); err == nil {
			t.Errorf("ParseIPVSAdm(%q): want an error", bad)
		}
	}
}

const ipsetSave = `create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536 comment bucketsize 12 initval 0x5d4c3b2a
add KUBE-CLUSTER-IP 198.19.0.10,tcp:53
add KUBE-CLUSTER-IP 198.19.0.10,udp:53
create KUBE-NODE-PORT-TCP bitmap:port range 0-65535 comment
add KUBE-NODE-PORT-TCP 30080
create KUBE-6-LOAD-BALANCER-SOURCE-CID hash:ip,port,net family inet6 hashsize 1024 maxelem 65536 comment bucketsize 12 initval 0x11223344
add KUBE-6-LOAD-BALANCER-SOURCE-CID fd00:19::c8:1,tcp:443,fd00:18::/64
create foreign hash:net family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0x1
add foreign 203.0.113.0/24 timeout 0
`

func TestParseIPSetSave(t *testing.T) {
	got, err := ParseIPSetSave(ipsetSave)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]*trace.IPSet{
		"KUBE-CLUSTER-IP":                 {Name: "KUBE-CLUSTER-IP", Type: "hash:ip,port", Entries: []string{"198.19.0.10,tcp:53", "198.19.0.10,udp:53"}},
		"KUBE-NODE-PORT-TCP":              {Name: "KUBE-NODE-PORT-TCP", Type: "bitmap:port", Entries: []string{"30080"}},
		"KUBE-6-LOAD-BALANCER-SOURCE-CID": {Name: "KUBE-6-LOAD-BALANCER-SOURCE-CID", Type: "hash:ip,port,net", IPv6: true, Entries: []string{"fd00:19::c8:1,tcp:443,fd00:18::/64"}},
		"foreign":                         {Name: "foreign", Type: "hash:net", Entries: []string{"203.0.113.0/24"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	for _, bad := range []string{
		"add KUBE-CLUSTER-IP 198.19.0.10,tcp:53\n", // no create
		"create S hash:ip,port family inet\nadd S 198.19.0.10\n",
		"create S hash:ip family inet\nadd S fd00::1\n",
		"create S hash:net family inet\nadd S 10.0.0.0/8 nomatch\n",
	} {
		if _, err := ParseIPSetSave(bad); err == nil {
			t.Errorf("ParseIPSetSave(%q): want an error", bad)
		}
	}
}

// TestSplit: the three formats in one file come apart; nft text stays
// whole (its "add table" is no ipset line).
func TestSplit(t *testing.T) {
	ipt := "*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT\nCOMMIT\n"
	p, err := Split("# kube-ipvs0: 198.19.0.10 198.19.0.11\n" + ipvsadmS + ipsetSave + ipt + ipvsadmLn)
	if err != nil {
		t.Fatal(err)
	}
	if p.IPVSAdm != ipvsadmS+ipvsadmLnTrimmed() {
		t.Errorf("ipvsadm part:\n%s", p.IPVSAdm)
	}
	if p.IPSet != ipsetSave {
		t.Errorf("ipset part:\n%s", p.IPSet)
	}
	if strings.TrimSpace(p.IPTables) != strings.TrimSpace(ipt) {
		t.Errorf("iptables part:\n%s", p.IPTables)
	}
	if len(p.DummyAddrs) != 2 {
		t.Errorf("kube-ipvs0 addresses: %v", p.DummyAddrs)
	}
	nft := "add table ip kube-proxy { comment \"rules for kube-proxy\" ; }\nadd chain ip kube-proxy services\n"
	if p, _ := Split(nft); p.IPSet != "" || p.IPVSAdm != "" {
		t.Errorf("nft text taken for ipset or ipvsadm: %+v", p)
	}
}

func ipvsadmLnTrimmed() string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimSuffix(ipvsadmLn, "\n"), "\n") {
		b.WriteString(strings.TrimSpace(l) + "\n")
	}
	return b.String()
}

// TestParseErrorsNameTheLine: an error names the file kind, the line
// number and the line.
func TestParseErrorsNameTheLine(t *testing.T) {
	_, err := ParseIPVSAdm("-A -t 198.19.0.10:80 -s rr\n  -A -t 198.19.0.10:80 -s rr  \n")
	if want := `ipvsadm line 2 "-A -t 198.19.0.10:80 -s rr": virtual server given twice`; err == nil || err.Error() != want {
		t.Errorf("ParseIPVSAdm: %v, want %s", err, want)
	}
	_, err = ParseIPSetSave("create KUBE-CLUSTER-IP hash:ip,port family inet\nadd KUBE-LOOP-BACK 198.18.129.5\n")
	if want := `ipset save line 2 "add KUBE-LOOP-BACK 198.18.129.5": add to a set not created before`; err == nil || err.Error() != want {
		t.Errorf("ParseIPSetSave: %v, want %s", err, want)
	}
}
