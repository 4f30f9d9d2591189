package main

// Address plan: 198.18.0.0/16 nodes and pods, 198.19.0.0/16 service IPs
// (the built-in example).

import (
	"strings"
	"testing"
)

func TestRenderIPVS(t *testing.T) {
	out, _, err := execute(t, "render", "--proxy-mode", "ipvs")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"# IPv4: 14 service ports, 20 virtual servers, 16 addresses on kube-ipvs0, on a fresh node\n",
		"-A -t 198.19.0.10:80 -s rr\n-a -t 198.19.0.10:80 -r 198.18.129.10:8080 -m -w 1\n",
		"-A -t 198.19.0.16:80 -s rr -p 600\n",
		"add KUBE-CLUSTER-IP 198.19.0.10,tcp:80\n",
		"add KUBE-6-CLUSTER-IP fd00:19::17,tcp:80\n",
		"-A KUBE-SERVICES -m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set KUBE-CLUSTER-IP dst,dst ! -s 198.18.128.0/17 -j KUBE-MARK-MASQ\n",
		"-A KUBE-SERVICES -s ::1/128 -j RETURN\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	// Flags shape it: scheduler, mark bit, masqueradeAll.
	out, _, err = execute(t, "render", "--proxy-mode", "ipvs", "--ipvs-scheduler", "mh", "--iptables-masquerade-bit", "13", "--masquerade-all")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"-A -t 198.19.0.10:80 -s mh -b sh-port\n",
		"--or-mark 0x00002000",
		"--match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("with flags, output lacks %q", want)
		}
	}
	if _, _, err := execute(t, "render", "--proxy-mode", "ipvs", "--ipvs-scheduler", "foo"); err == nil || !strings.Contains(err.Error(), "foo") {
		t.Errorf("an unknown scheduler: want an error naming it, got %v", err)
	}
}
