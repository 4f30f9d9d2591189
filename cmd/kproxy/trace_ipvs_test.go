package main

// Address plan: 198.18.0.0/16 nodes and pods (node-a 198.18.0.10, pods in
// 198.18.128.0/17), 198.19.0.0/16 service IPs, fd00::/8 IPv6 (the
// built-in example).

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/*.golden")

// TestTraceIPVSGolden: ipvs mode's trace of the built-in example, as a
// fresh node gets it, pinned in golden files.
func TestTraceIPVSGolden(t *testing.T) {
	for _, tc := range []struct {
		golden string
		args   []string
	}{
		{"trace-ipvs-clusterip.golden", []string{"--src", "198.18.129.5", "--iif", "veth1", "--dst", "198.19.0.10:80"}},
		{"trace-ipvs-nodeport.golden", []string{"--src", "203.0.113.9", "--iif", "eth0", "--dst", "198.18.0.10:30080"}},
		{"trace-ipvs-affinity.golden", []string{"--dst", "198.19.0.16:80"}},
		{"trace-ipvs-lb-denied.golden", []string{"--src", "192.0.2.7", "--iif", "eth0", "--dst", "198.19.200.1:443"}},
		{"trace-ipvs-ipv6.golden", []string{"--dst", "[fd00:19::17]:80"}},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			out, _, err := execute(t, append([]string{"trace", "--proxy-mode", "ipvs"}, tc.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", tc.golden)
			if *updateGolden {
				if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(string(want), out); diff != "" {
				t.Errorf("trace differs from %s (-want +got; go test -run TestTraceIPVSGolden -update):\n%s", path, diff)
			}
		})
	}
}

// TestTraceIPVS: what the traces say, and that saved state (render's
// output in one file, or the three tools' outputs in three) traces alike.
func TestTraceIPVS(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []string
		not  []string
	}{
		{"pod to a ClusterIP", []string{"--src", "198.18.129.5", "--iif", "veth1", "--dst", "198.19.0.10:80"},
			[]string{"ipvs INPUT (priority 98): virtual server TCP 198.19.0.10:80 rr", "accept, dnat to 198.18.129.10:8080\n", "accept, dnat to 198.18.130.10:8080\n"}, []string{"masquerade"}},
		{"node to a ClusterIP is masqueraded", []string{"--dst", "198.19.0.10:80"},
			[]string{"ipvs OUTPUT (priority -99)", "dnat to 198.18.129.10:8080, masquerade"}, nil},
		{"NodePort from outside", []string{"--src", "203.0.113.9", "--iif", "eth0", "--dst", "198.18.0.10:30080"},
			[]string{"KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ", "virtual server TCP 198.18.0.10:30080 rr", "masquerade"}, nil},
		{"ClientIP affinity", []string{"--dst", "198.19.0.16:80"},
			[]string{"virtual server TCP 198.19.0.16:80 rr persistent 600", "persistent 600s"}, nil},
		{"UDP", []string{"--proto", "udp", "--dst", "198.19.0.18:53"},
			[]string{"virtual server UDP 198.19.0.18:53 rr", "dnat to 198.18.129.53:53"}, nil},
		{"a service without endpoints: no real server", []string{"--src", "198.18.129.5", "--iif", "veth1", "--dst", "198.19.0.20:80"},
			[]string{"virtual server TCP 198.19.0.20:80 rr", "reject"}, []string{"dnat to"}},
		{"the LB from a source outside its ranges is dropped", []string{"--src", "192.0.2.7", "--iif", "eth0", "--dst", "198.19.200.1:443"},
			[]string{"KUBE-SOURCE-RANGES-FIREWALL: -j DROP", "drop"}, []string{"dnat to"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := execute(t, append([]string{"trace", "--proxy-mode", "ipvs"}, tc.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("trace lacks %q:\n%s", w, out)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(out, n) {
					t.Errorf("trace has %q:\n%s", n, out)
				}
			}
		})
	}

	rendered, _, err := execute(t, "render", "--proxy-mode", "ipvs")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	snapshot, _, err := execute(t, "trace", "--proxy-mode", "ipvs", "--src", "203.0.113.9", "--iif", "eth0", "--dst", "198.18.0.10:30080")
	if err != nil {
		t.Fatal(err)
	}
	// render's output as one file: recognised as ipvs mode without
	// --proxy-mode, its IPv4 section taken for an IPv4 packet.
	all := write("render.txt", rendered)
	got, _, err := execute(t, "trace", "--rules", all, "--local-address", "198.18.0.10", "--src", "203.0.113.9", "--iif", "eth0", "--dst", "198.18.0.10:30080")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(snapshot, got); diff != "" {
		t.Errorf("trace over render's saved output differs from the snapshot's (-snapshot +saved):\n%s", diff)
	}
	// Three files as the tools write them: ipvsadm -S -n, ipset save,
	// iptables-save (one family).
	v4, _, _ := strings.Cut(rendered, "# IPv6")
	var adm, sets, ipt strings.Builder
	section := ""
	for _, l := range strings.SplitAfter(v4, "\n") {
		switch {
		case strings.HasPrefix(l, "# ipvsadm"), strings.HasPrefix(l, "# ipset"), strings.HasPrefix(l, "# iptables"):
			section = l
		case strings.HasPrefix(l, "#"):
		case strings.HasPrefix(section, "# ipvsadm"):
			adm.WriteString(l)
		case strings.HasPrefix(section, "# ipset"):
			sets.WriteString(l)
		default:
			ipt.WriteString(l)
		}
	}
	got, _, err = execute(t, "trace", "--rules", write("ipvsadm.save", adm.String()), "--rules", write("ipset.save", sets.String()),
		"--rules", write("iptables.save", ipt.String()), "--local-address", "198.18.0.10", "--src", "203.0.113.9", "--iif", "eth0", "--dst", "198.18.0.10:30080")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(snapshot, got); diff != "" {
		t.Errorf("trace over three saved files differs from the snapshot's (-snapshot +saved):\n%s", diff)
	}
	// Bad input: a clear error.
	bad := write("bad.save", "-A -t 198.19.0.1:80 -s rr\n-a -t 198.19.0.2:80 -r 198.18.0.1:80 -m -w 1\n")
	if _, _, err := execute(t, "trace", "--rules", bad, "--dst", "198.19.0.1:80"); err == nil || !strings.Contains(err.Error(), "ipvsadm line 2") {
		t.Errorf("a real server of an unknown virtual server: want an error naming the line, got %v", err)
	}
}
