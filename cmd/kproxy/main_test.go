package main

// Address plan: 198.18.0.0/16 nodes and pods, 198.19.0.0/16 service IPs.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/view"
)

// execute runs the command tree with args, as main would.
func execute(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := newRootCommand()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err = cmd.Execute()
	return out.String(), errOut.String(), err
}

func TestRenderExampleTable(t *testing.T) {
	out, _, err := execute(t, "render")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"# node node-a (zone zone-a)",
		"demo/web-clusterip:http/TCP", "198.19.0.10:80/tcp",
		"demo/no-endpoints:http/TCP", "reject: no endpoints",
		"topology: hinted for other zones",
		"198.19.0.12:443/tcp +4 more",
		"## IPv6", "[fd00:19::17]:80/tcp",
		"Service demo/headless", "Service demo/other-proxy",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("render output lacks %q", want)
		}
	}
}

// The default table fits a 120-column terminal on the example, whose
// LoadBalancer rows have five addresses each; -o wide lists every address,
// source range and endpoint the model holds.
func TestRenderTableWidth(t *testing.T) {
	out, _, err := execute(t, "render")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		if n := len([]rune(line)); n > 120 {
			t.Errorf("line of %d columns:\n%s", n, line)
		}
	}

	wide, _, err := execute(t, "render", "-o", "wide")
	if err != nil {
		t.Fatal(err)
	}
	js, _, err := execute(t, "render", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var snap view.Snapshot
	if err := json.Unmarshal([]byte(js), &snap); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(wide, "\n")
	checked := 0
	for _, f := range snap.Families {
		for _, sv := range f.Services {
			want := append([]string{sv.ClusterIP}, sv.ExternalIPs...)
			want = append(want, sv.LoadBalancerVIPs...)
			want = append(want, sv.LoadBalancerProxyIPs...)
			want = append(want, sv.LoadBalancerSourceRanges...)
			want = append(want, sv.Cluster...)
			want = append(want, sv.Local...)
			if sv.NodePort != 0 {
				want = append(want, fmt.Sprintf("nodePort %d", sv.NodePort))
			}
			if sv.HealthCheckNodePort != 0 {
				want = append(want, fmt.Sprintf("health %d", sv.HealthCheckNodePort))
			}
			row := rowOf(lines, string(f.Family), sv.Name)
			for _, w := range want {
				if !strings.Contains(row, w) {
					t.Errorf("-o wide, %s %s lacks %q:\n%s", f.Family, sv.Name, w, row)
				}
				checked++
			}
		}
	}
	if checked < 50 {
		t.Fatalf("only %d addresses checked: the example should have more", checked)
	}
}

// rowOf is the table row of service port name in the family's section.
func rowOf(lines []string, family, name string) string {
	in := false
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "## "):
			in = l == "## "+family
		case in && strings.HasPrefix(l, name+" "):
			return l
		}
	}
	return ""
}

func TestRenderJSONForOtherNode(t *testing.T) {
	out, _, err := execute(t, "render", "-o", "json", "--hostname-override", "node-b")
	if err != nil {
		t.Fatal(err)
	}
	var snap view.Snapshot
	if err := json.Unmarshal([]byte(out), &snap); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if snap.Node != "node-b" || snap.Zone != "zone-b" {
		t.Fatalf("node = %q zone = %q", snap.Node, snap.Zone)
	}
	// itp-local has an endpoint on node-a only: node-b drops internal traffic.
	for _, s := range snap.Families[0].Services {
		if s.Name == "demo/itp-local:http/TCP" {
			if len(s.Local) != 0 || !strings.HasPrefix(s.Verdict, "drop internal traffic") {
				t.Fatalf("itp-local on node-b: local=%v verdict=%q", s.Local, s.Verdict)
			}
			return
		}
	}
	t.Fatal("itp-local not in the output")
}

func TestRenderFileAsKubectlWritesIt(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cluster.yaml")
	if err := os.WriteFile(path, example.YAML, 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err := execute(t, "render", "-f", path, "--hostname-override", "node-a", "-o", "yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "name: demo/web-nodeport:http/TCP") || !strings.Contains(out, "nodePort: 30080") {
		t.Fatalf("yaml output lacks the NodePort service:\n%s", out)
	}
	// More than one node and no --hostname-override: a clear error.
	if _, _, err := execute(t, "render", "-f", path); err == nil || !strings.Contains(err.Error(), "--hostname-override") {
		t.Fatalf("want an error asking for --hostname-override, got %v", err)
	}
}

func TestRenderNFTablesRules(t *testing.T) {
	out, _, err := execute(t, "render", "--proxy-mode", "nftables")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"add table ip kube-proxy",
		"add table ip6 kube-proxy",
		"add table ip kube-proxy-s0",
		// A plain ClusterIP port goes through cluster-services, a
		// NodePort service's port through service-ips.
		"add element ip kube-proxy-s0 cluster-services { 198.19.0.10 . tcp . 80",
		"add element ip kube-proxy-s0 service-ips { 198.19.0.11 . tcp . 80",
		"add element ip kube-proxy no-endpoint-services { 198.19.0.20 . tcp . 80",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("rules lack %q", want)
		}
	}
	if strings.Contains(out, "# conflict") {
		t.Errorf("the example should have no conflicts:\n%s", out)
	}
}

func TestBadConfigReportsEveryProblemAndFailsBeforeRunning(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	cfg := `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: bogus
clusterCIDR: not-a-cidr
conntrack:
  maxPerCore: -1
`
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err := execute(t, "--config", path, "--hostname-override", "node-a")
	if err == nil {
		t.Fatal("a bad config file was accepted")
	}
	var ue usageError
	if !asUsage(err, &ue) {
		t.Fatalf("want a usage error, got %T %v", err, err)
	}
	for _, field := range []string{"mode", "clusterCIDR", "conntrack.maxPerCore"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("error does not name %s:\n%v", field, err)
		}
	}
}

func TestBadFlagAndEnv(t *testing.T) {
	if _, _, err := execute(t, "--no-such-flag"); err == nil {
		t.Fatal("unknown flag accepted")
	}
	t.Setenv("IPTABLES_MODE", "nftables")
	_, _, err := execute(t, "--proxy-mode", "nftables", "--hostname-override", "node-a")
	if err == nil || !strings.Contains(err.Error(), "IPTABLES_MODE") || !strings.Contains(err.Error(), "legacy") {
		t.Fatalf("bad IPTABLES_MODE: want an error naming the allowed values, got %v", err)
	}
}

func TestHelpListsUpstreamFlags(t *testing.T) {
	out, _, err := execute(t, "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"--proxy-mode", "--config", "--kubeconfig", "--master", "--hostname-override",
		"--cluster-cidr", "--nodeport-addresses", "--masquerade-all", "--iptables-masquerade-bit",
		"--iptables-sync-period", "--iptables-min-sync-period", "--iptables-localhost-nodeports",
		"--ipvs-scheduler", "--detect-local-mode", "--pod-bridge-interface", "--pod-interface-name-prefix",
		"--conntrack-max-per-core", "--healthz-bind-address", "--metrics-bind-address",
		"--bind-address-hard-fail", "--cleanup", "--feature-gates", "-v, --v"} {
		if !strings.Contains(out, f) {
			t.Errorf("--help lacks %s", f)
		}
	}
}

func asUsage(err error, target *usageError) bool {
	for err != nil {
		if u, ok := err.(usageError); ok {
			*target = u
			return true
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		err = u.Unwrap()
	}
	return false
}

func TestTraceExample(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []string
		not  []string
	}{
		{"node to a ClusterIP", []string{"--dst", "198.19.0.10:80"},
			[]string{"from a local process", "dnat to 198.18.129.10:8080", "dnat to 198.18.130.10:8080", "p=0.5"}, nil},
		{"allowed source to an LB with source ranges", []string{"--src", "198.18.0.100", "--iif", "eth0", "--dst", "198.19.200.1:443"},
			[]string{"in eth0", "dnat to"}, []string{"drop"}},
		{"other source to the LB is dropped", []string{"--src", "192.0.2.7", "--iif", "eth0", "--dst", "198.19.200.1:443"},
			[]string{"drop"}, []string{"dnat to"}},
		{"service without endpoints is rejected", []string{"--src", "198.18.129.5", "--iif", "veth1", "--dst", "198.19.0.20:80"},
			[]string{"reject"}, []string{"dnat to"}},
		{"UDP over IPv6 to the dual-stack service", []string{"--dst", "[fd00:19::17]:80"},
			[]string{"dnat to [fd00:18:1:a::50]:8080", "dnat to [fd00:18:1:b::50]:8080"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := execute(t, append([]string{"trace"}, tc.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("trace output lacks %q:\n%s", w, out)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(out, n) {
					t.Errorf("trace output has %q:\n%s", n, out)
				}
			}
		})
	}
}

func TestTraceRulesFileAndBadInput(t *testing.T) {
	rules, _, err := execute(t, "render", "--proxy-mode", "nftables")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "rules.nft")
	if err := os.WriteFile(path, []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err := execute(t, "trace", "--rules", path, "--local-address", "198.18.0.10", "--src", "198.18.129.5", "--iif", "veth1", "--dst", "198.19.0.13:8080")
	if err != nil || !strings.Contains(out, "dnat to 198.18.129.10:8080") {
		t.Fatalf("trace over a rules file: %v\n%s", err, out)
	}
	if _, _, err := execute(t, "trace", "--dst", "198.19.0.10"); err == nil || !strings.Contains(err.Error(), "--dst") {
		t.Fatalf("a --dst without port: want an error naming --dst, got %v", err)
	}
	if _, _, err := execute(t, "trace", "--dst", "198.19.0.10:80", "--proto", "icmp"); err == nil || !strings.Contains(err.Error(), "--proto") {
		t.Fatalf("--proto icmp: want an error naming --proto, got %v", err)
	}
}

// TestHostnameOverrideFromFileNormalized: a config file's hostnameOverride
// is used trimmed and lower-cased, as upstream's GetHostname does ("Node-B"
// names node-b; it was refused).
func TestHostnameOverrideFromFileNormalized(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	cfg := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nhostnameOverride: \" Node-B \"\n"
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err := execute(t, "render", "--config", path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "# node node-b (zone zone-b)") {
		t.Errorf("render did not act for node-b:\n%s", out)
	}
	if h, err := config.Hostname(&v1alpha1.KubeProxyConfiguration{HostnameOverride: "Node-A"}); err != nil || h != "node-a" {
		t.Errorf("hostname(Node-A) = %q, %v; want node-a", h, err)
	}
	if _, err := config.Hostname(&v1alpha1.KubeProxyConfiguration{HostnameOverride: " \t"}); err == nil {
		t.Error("a blank hostnameOverride was accepted")
	}
}
