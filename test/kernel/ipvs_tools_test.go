package kernel

// Address plan (the built-in example): node-a 198.18.0.10, pods in
// 198.18.128.0/17, services in 198.19.0.0/16, the client (outside)
// 198.18.0.100. Another program's virtual server sits on the node's
// address at 8443, a port of no NodePort (created by the test).

import (
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/kernel/ipset"
	kipvs "github.com/kproxy/kproxy/internal/kernel/ipvs"
)

// testIPVSTools: the tools on a live ipvs mode node. `trace --live`
// (which finds ipvs mode by kube-ipvs0, without --proxy-mode) names the
// real servers real traffic reaches, for a ClusterIP and a NodePort;
// `doctor` reports kube-ipvs0, the virtual servers with their owners
// and the scheduler's module; `--cleanup` removes ipvs mode's virtual
// servers, sets, kube-ipvs0 and chains, and leaves another program's
// virtual server and ipset.
func testIPVSTools(t *testing.T, m proxyMode) {
	c := newCluster(t, clusterOptions{mode: m, kproxyOn: []string{nodeA}})
	node := c.Node(t, nodeA)
	nsPath := "/run/netns/" + node.NS.Name
	webIPs := map[string]netip.Addr{webA: c.Pod(t, webA).IP(clientIP), webB: c.Pod(t, webB).IP(clientIP)}

	// trace --live: the real servers of the virtual server, masqueraded
	// (from outside); real traffic reaches the same pods.
	env := append([]string{"env"}, m.env...)
	trace := append(slices.Clone(env), kproxyBin, "trace", "--live", "--src", "198.18.0.100", "--iif", "eth0")
	for _, dst := range []string{"198.19.0.10:80", "198.18.0.10:30080"} {
		out, err := node.Exec(60*time.Second, append(slices.Clone(trace), "--dst", dst)...)
		if err != nil {
			t.Fatalf("kproxy trace --live --dst %s: %v\n%s", dst, err, out)
		}
		for _, want := range []string{
			"ipvs INPUT (priority 98): virtual server TCP " + dst + " rr",
			"accept, dnat to " + webIPs[webA].String() + ":8080, masquerade",
			"accept, dnat to " + webIPs[webB].String() + ":8080, masquerade",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("trace --live --dst %s lacks %q:\n%s", dst, want, out)
			}
		}
		if dst == "198.19.0.10:80" {
			t.Logf("kproxy trace --live --dst %s on node-a:\n%s", dst, out)
		}
		if n := strings.Count(out, "\noutcome "); n != 2 {
			t.Errorf("trace --live --dst %s: %d outcomes, want the 2 web pods:\n%s", dst, n, out)
		}
		c.run(t, probe{from: client, network: "tcp", dst: dst, servers: web, every: true, peer: peerMasq, masqBy: nodeA})
	}
	// A service without endpoints: a virtual server without real servers.
	out, err := node.Exec(60*time.Second, append(slices.Clone(trace), "--dst", "198.19.0.20:80")...)
	if err != nil || !strings.Contains(out, "reject") || strings.Contains(out, "dnat to") {
		t.Errorf("trace --live to a service without endpoints: want a reject: %v\n%s", err, out)
	}

	// Another program's virtual server and ipset.
	h, err := kipvs.NewHandle(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	foreign := kipvs.VirtualServer{Protocol: 6, Addr: ip("198.18.0.10"), Port: 8443}
	if err := h.AddService(kipvs.Service{VirtualServer: foreign, Scheduler: "wrr"}); err != nil {
		t.Fatal(err)
	}
	if err := h.AddDestination(foreign, kipvs.Destination{Addr: webIPs[webA], Port: 8080, Weight: 2}); err != nil {
		t.Fatal(err)
	}
	sets, err := ipset.NewHandle(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer sets.Close()
	if err := sets.Create(ipset.Set{Name: "f2b-tools-test", Type: "hash:ip"}); err != nil {
		t.Fatal(err)
	}
	if err := sets.Add("f2b-tools-test", "198.18.0.77"); err != nil {
		t.Fatal(err)
	}

	// doctor on the live node.
	doctor := append(slices.Clone(env), kproxyBin, "doctor", "--proxy-mode", "ipvs", "--metrics-url", "http://127.0.0.1:10249")
	out, _ = node.Exec(60*time.Second, doctor...) // exit 1 when it finds an error: the report is what counts
	t.Logf("kproxy doctor on node-a:\n%s", out)
	dummy := regexp.MustCompile(`kube-ipvs0: present, (\d+) addresses`).FindStringSubmatch(out)
	if dummy == nil {
		t.Errorf("doctor does not report kube-ipvs0:\n%s", out)
	} else if n, _ := strconv.Atoi(dummy[1]); n < 10 {
		t.Errorf("doctor: kube-ipvs0 has %d addresses, want the example's service addresses:\n%s", n, out)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`IPVS: \d+ virtual servers`),
		regexp.MustCompile(`TCP 198\.19\.0\.10:80 +rr +2 real servers +kube-proxy's`),
		regexp.MustCompile(`TCP 198\.18\.0\.10:30080 +rr +2 real servers +kube-proxy's`),
		regexp.MustCompile(`TCP 198\.18\.0\.10:8443 +wrr +1 real servers +foreign`),
		regexp.MustCompile(`IPVS timeouts: tcp \d+s, tcpfin \d+s, udp \d+s`),
		regexp.MustCompile(`OK +ipvs\.scheduler "rr": module ip_vs_rr loaded`),
		regexp.MustCompile(`OK +a proxy answers on /proxyMode: ipvs`),
		regexp.MustCompile(`OK +1 IPVS virtual servers of another program`),
	} {
		if !want.MatchString(out) {
			t.Errorf("doctor's report lacks %s:\n%s", want, out)
		}
	}

	// ipvs mode's own chains are not taken for iptables mode's or for
	// rules of another program.
	for _, bad := range []string{"rules in kube-proxy's chains of the", "rules of several proxy modes"} {
		if strings.Contains(out, bad) {
			t.Errorf("doctor on a healthy ipvs node reports %q:\n%s", bad, out)
		}
	}

	// --cleanup with kproxy stopped.
	if err := c.kproxy[nodeA].Stop(); err != nil {
		t.Fatal(err)
	}
	if out, err := node.Exec(60*time.Second, append(slices.Clone(env), kproxyBin, "--cleanup", "-v", "2")...); err != nil {
		t.Fatalf("kproxy --cleanup: %v\n%s", err, out)
	}
	d, err := dumpIPVS(node.NS)
	if err != nil {
		t.Fatal(err)
	}
	if want := "TCP 198.18.0.10:8443 wrr\n  -> " + netip.AddrPortFrom(webIPs[webA], 8080).String() + " weight 2\n"; d != want {
		t.Errorf("IPVS after --cleanup:\n%s\nwant only the foreign virtual server:\n%s", d, want)
	}
	have, err := sets.Sets()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(have, []string{"f2b-tools-test"}) {
		t.Errorf("ipsets after --cleanup: %v, want only the foreign one", have)
	}
	if es, _ := sets.Entries("f2b-tools-test"); !slices.Equal(es, []string{"198.18.0.77"}) {
		t.Errorf("the foreign ipset's members after --cleanup: %v", es)
	}
	if out, err := node.Exec(10*time.Second, "ip", "link", "show", "kube-ipvs0"); err == nil {
		t.Errorf("kube-ipvs0 still exists after --cleanup:\n%s", out)
	}
	for _, bin := range m.needs {
		out, err := node.Exec(10*time.Second, bin)
		if err != nil {
			t.Fatalf("%s: %v", bin, err)
		}
		if strings.Contains(out, "KUBE-") {
			t.Errorf("%s after --cleanup still has kube-proxy's chains:\n%s", bin, out)
		}
	}
	// The foreign virtual server still serves.
	c.run(t, probe{from: client, network: "tcp", dst: "198.18.0.10:8443", n: 2, servers: []string{webA}, peer: peerOwn})
}
