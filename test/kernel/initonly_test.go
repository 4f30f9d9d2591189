package kernel

// Address plan: 198.18.0.0/16 nodes and pods, 198.19.0.0/16 service IPs.
// These tests need no traffic: they check what kproxy leaves in a fresh
// network namespace's sysctls and in its own process.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/kube-proxy/config/v1alpha1"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/internal/kernel/conntrack"
	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// kubeadmConfig is the KubeProxyConfiguration of kubeadm's kube-proxy
// ConfigMap (config.conf), as `kubeadm init` writes it: every conntrack
// field null, so upstream's defaults apply. The kubeconfig does not exist:
// --init-only needs no API server.
const kubeadmConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 198.18.0.0/16
configSyncPeriod: 0s
conntrack:
  maxPerCore: null
  min: null
  tcpBeLiberal: false
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: "node-a"
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
metricsBindAddress: ""
mode: "%s"
nodePortAddresses: null
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
`

// explicitConfig sets every conntrack field kube-proxy applies.
const explicitConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
hostnameOverride: node-a
mode: nftables
conntrack:
  maxPerCore: 0
  tcpEstablishedTimeout: 2h
  tcpCloseWaitTimeout: 90s
  tcpBeLiberal: true
  udpTimeout: 45s
  udpStreamTimeout: 3m
`

const (
	ctMax         = "net.netfilter.nf_conntrack_max"
	ctEstablished = "net.netfilter.nf_conntrack_tcp_timeout_established"
	ctCloseWait   = "net.netfilter.nf_conntrack_tcp_timeout_close_wait"
	ctLiberal     = "net.netfilter.nf_conntrack_tcp_be_liberal"
	ctUDP         = "net.netfilter.nf_conntrack_udp_timeout"
	ctUDPStream   = "net.netfilter.nf_conntrack_udp_timeout_stream"
	routeLocalnet = "net.ipv4.conf.all.route_localnet"
)

var initSysctls = []string{ctMax, ctEstablished, ctCloseWait, ctLiberal, ctUDP, ctUDPStream, routeLocalnet}

// TestInitOnlySysctls runs `kproxy --init-only` in a fresh network
// namespace and checks the sysctls it leaves: the conntrack settings as
// upstream applies them (0 leaves a value as it is; nf_conntrack_max is
// global, only raised, and read-only here) and, in iptables mode,
// route_localnet for node ports on 127.0.0.1. kproxy must exit 0 without
// programming any rule.
func TestInitOnlySysctls(t *testing.T) {
	requireKernel(t)
	t.Parallel()
	hostMax := readIntFile(t, "/proc/sys/net/netfilter/nf_conntrack_max")
	hostHash := readIntFile(t, conntrack.HashsizePath)
	kubeadmMax := conntrack.Max(&v1alpha1.KubeProxyConntrackConfiguration{MaxPerCore: ptr.To[int32](32768), Min: ptr.To[int32](131072)}, conntrack.NumCPU())

	for _, tt := range []struct {
		name   string
		config string // "" runs with flags only
		args   []string
		// want lists the sysctls that change; the others must keep the
		// fresh namespace's values.
		want map[string]string
	}{{
		name:   "kubeadm ConfigMap, nftables",
		config: fmt.Sprintf(kubeadmConfig, "nftables"),
		want:   map[string]string{ctEstablished: "86400", ctCloseWait: "3600"},
	}, {
		name:   "kubeadm ConfigMap, iptables (empty mode)",
		config: fmt.Sprintf(kubeadmConfig, ""),
		want:   map[string]string{ctEstablished: "86400", ctCloseWait: "3600", routeLocalnet: "1"},
	}, {
		name:   "explicit values",
		config: explicitConfig,
		want: map[string]string{ctEstablished: "7200", ctCloseWait: "90", ctLiberal: "1",
			ctUDP: "45", ctUDPStream: "180"},
	}, {
		name: "flags: zero leaves values, underscore spelling",
		args: []string{"--proxy-mode", "nftables", "--hostname-override", "node-a", "--conntrack-max-per-core=0",
			"--conntrack-tcp-timeout-established=0", "--conntrack_tcp_timeout_close_wait=0", "--conntrack_udp_timeout=50s"},
		want: map[string]string{ctUDP: "50"},
	}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if tt.config != "" && strings.Contains(tt.config, "maxPerCore: null") {
				if kubeadmMax > hostMax {
					t.Skipf("kubeadm's nf_conntrack_max %d is above this host's %d: kproxy would have to raise a global sysctl, which a network namespace cannot", kubeadmMax, hostMax)
				}
				if hostHash < kubeadmMax/4 {
					t.Skipf("the host's conntrack hash size %d is below %d: kproxy would grow it for the whole host", hostHash, kubeadmMax/4)
				}
			}
			ns := netns.New(t, netns.RandomID(6), "init")
			before := readSysctls(t, ns)
			args := append([]string{kproxyBin, "--init-only", "-v", "2"}, tt.args...)
			if tt.config != "" {
				path := filepath.Join(t.TempDir(), "config.conf")
				if err := os.WriteFile(path, []byte(tt.config), 0o644); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--config", path)
			}
			out, err := ns.Exec(30*time.Second, args...)
			if err != nil {
				t.Fatalf("kproxy --init-only: %v\n%s", err, out)
			}
			after := readSysctls(t, ns)
			for _, k := range initSysctls {
				want, changes := tt.want[k]
				if !changes {
					want = before[k]
				}
				if after[k] != want {
					t.Errorf("%s = %s after --init-only, want %s (before: %s)", k, after[k], want, before[k])
				}
			}
			if after[ctMax] != strconv.Itoa(hostMax) {
				t.Errorf("nf_conntrack_max = %s, want the host's %d", after[ctMax], hostMax)
			}
			if rules, err := ns.Exec(10*time.Second, "nft", "list", "ruleset"); err != nil || strings.TrimSpace(rules) != "" {
				t.Errorf("--init-only programmed rules (err %v):\n%s", err, rules)
			}
		})
	}
}

// TestInitOnlyCannotRaiseMax: nf_conntrack_max is global and read-only
// outside the initial network namespace; asking for more than the host has
// fails with a message naming it, as upstream fails, and changes nothing.
func TestInitOnlyCannotRaiseMax(t *testing.T) {
	requireKernel(t)
	t.Parallel()
	hostMax := readIntFile(t, "/proc/sys/net/netfilter/nf_conntrack_max")
	perCore := hostMax/conntrack.NumCPU() + 1
	if perCore*conntrack.NumCPU() > 1<<20 {
		t.Skipf("the host's nf_conntrack_max %d is at the 2^20 cap already", hostMax)
	}
	ns := netns.New(t, netns.RandomID(6), "init")
	out, err := ns.Exec(30*time.Second, kproxyBin, "--init-only", "--proxy-mode", "nftables", "--hostname-override", "node-a",
		"--conntrack-max-per-core", strconv.Itoa(perCore), "--conntrack-tcp-timeout-established=1h")
	if err == nil || !strings.Contains(out, "nf_conntrack_max") {
		t.Fatalf("kproxy --init-only asking for nf_conntrack_max %d above the host's %d: err %v, want a failure naming nf_conntrack_max\n%s", perCore*conntrack.NumCPU(), hostMax, err, out)
	}
	if v := readIntFile(t, "/proc/sys/net/netfilter/nf_conntrack_max"); v != hostMax {
		t.Errorf("host nf_conntrack_max changed: %d -> %d", hostMax, v)
	}
}

// TestConfigFileChangeExits: kproxy running with --config applies
// oomScoreAdj to itself (a positive value: lowering it needs
// CAP_SYS_RESOURCE, which a test sandbox may lack; upstream then only logs
// at -v=2, and so does kproxy), and exits when the file changes (edited in place,
// or replaced as a ConfigMap volume replaces it), as upstream does so that
// its pod restarts with the new configuration.
func TestConfigFileChangeExits(t *testing.T) {
	requireKernel(t)
	t.Parallel()
	const conf = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
hostnameOverride: node-a
clusterCIDR: 198.18.0.0/16
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
oomScoreAdj: 321
conntrack:
  maxPerCore: 0
`
	for _, tt := range []struct {
		name   string
		setup  func(t *testing.T, dir string) string
		change func(t *testing.T, dir string)
	}{{
		name: "edit in place",
		setup: func(t *testing.T, dir string) string {
			writeFile(t, filepath.Join(dir, "config.conf"), conf)
			return filepath.Join(dir, "config.conf")
		},
		change: func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "config.conf"), strings.Replace(conf, "321", "322", 1))
		},
	}, {
		name: "ConfigMap volume update",
		setup: func(t *testing.T, dir string) string {
			mkdir(t, filepath.Join(dir, "..v1"))
			writeFile(t, filepath.Join(dir, "..v1", "config.conf"), conf)
			symlink(t, "..v1", filepath.Join(dir, "..data"))
			symlink(t, "..data/config.conf", filepath.Join(dir, "config.conf"))
			return filepath.Join(dir, "config.conf")
		},
		change: func(t *testing.T, dir string) {
			// The kubelet's atomic writer: new directory, ..data swapped
			// by a rename, old directory removed.
			mkdir(t, filepath.Join(dir, "..v2"))
			writeFile(t, filepath.Join(dir, "..v2", "config.conf"), strings.Replace(conf, "321", "322", 1))
			symlink(t, "..v2", filepath.Join(dir, "..data_tmp"))
			if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
				t.Fatal(err)
			}
			if err := os.RemoveAll(filepath.Join(dir, "..v1")); err != nil {
				t.Fatal(err)
			}
		},
	}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ns := netns.New(t, netns.RandomID(6), "node")
			snap := filepath.Join(t.TempDir(), "snapshot.yaml")
			exampleSnapshot(t).writeTo(t, snap)
			path := tt.setup(t, t.TempDir())
			p := netns.StartProcess(t, ns, "kproxy", t.TempDir(), kproxyBin, "--config", path, "--from-file", snap, "-v", "2")
			netns.Eventually(t, syncTimeout, "kproxy serving metrics", func() (bool, string) {
				if done, err := p.Exited(); done {
					t.Fatalf("kproxy exited: %v\n%s", err, p.Tail(netns.LogTailLines))
				}
				code, _, err := ns.HTTPGet("http://127.0.0.1:10249/metrics", 2*time.Second)
				return err == nil && code == 200, fmt.Sprintf("metrics: %d %v", code, err)
			})
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", p.Pid()))
			if err != nil || strings.TrimSpace(string(b)) != "321" {
				t.Errorf("kproxy's oom_score_adj = %q (%v), want 321 (oomScoreAdj)", b, err)
			}
			time.Sleep(500 * time.Millisecond)
			if done, err := p.Exited(); done {
				t.Fatalf("kproxy exited before the config changed: %v\n%s", err, p.Tail(netns.LogTailLines))
			}
			tt.change(t, filepath.Dir(path))
			netns.Eventually(t, 10*time.Second, "kproxy to exit after the config file changed", func() (bool, string) {
				done, _ := p.Exited()
				return done, "still running"
			})
			if _, err := p.Exited(); err == nil {
				t.Errorf("kproxy exited with status 0 after a config change, want an error exit (the pod restarts)")
			}
			if !strings.Contains(p.Log(), "configuration file was updated") {
				t.Errorf("kproxy's log does not say why it exited:\n%s", p.Tail(netns.LogTailLines))
			}
		})
	}
}

func readSysctls(t *testing.T, ns *netns.NS) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, k := range initSysctls {
		v, err := ns.ReadSysctl(k)
		if err != nil {
			t.Fatal(err)
		}
		m[k] = v
	}
	return m
}

func readIntFile(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Skipf("kernel test skipped: %v (nf_conntrack not loaded?)", err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return v
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mkdir(t *testing.T, path string) {
	t.Helper()
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, path string) {
	t.Helper()
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}

// TestJSONLogs: logging.format json (flag or config file) gives one JSON
// object per log line, as upstream's kube-proxy writes with the json
// format registered. Run with --init-only in a fresh namespace.
func TestJSONLogs(t *testing.T) {
	requireKernel(t)
	t.Parallel()
	conf := filepath.Join(t.TempDir(), "config.conf")
	writeFile(t, conf, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\nhostnameOverride: node-a\nconntrack:\n  maxPerCore: 0\nlogging:\n  format: json\n")
	for name, args := range map[string][]string{
		"flag":        {"--proxy-mode", "nftables", "--hostname-override", "node-a", "--conntrack-max-per-core=0", "--logging-format=json"},
		"config file": {"--config", conf},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ns := netns.New(t, netns.RandomID(6), "init")
			out, err := ns.Exec(30*time.Second, append([]string{kproxyBin, "--init-only", "-v", "2"}, args...)...)
			if err != nil {
				t.Fatalf("kproxy: %v\n%s", err, out)
			}
			sawSysctl := false
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				var entry map[string]any
				if err := json.Unmarshal([]byte(line), &entry); err != nil || entry["msg"] == nil {
					t.Fatalf("log line is not a JSON entry with msg (%v): %q\n%s", err, line, out)
				}
				sawSysctl = sawSysctl || entry["msg"] == "Set sysctl"
			}
			if !sawSysctl {
				t.Errorf("no \"Set sysctl\" entry in the JSON log:\n%s", out)
			}
		})
	}
}
