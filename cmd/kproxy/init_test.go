package main

// Address plan: 198.18.0.0/16 nodes and pods, 198.19.0.0/16 service IPs.

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/kernel/conntrack"
	"github.com/kproxy/kproxy/internal/kernel/sysctl/sysctltest"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/iptables"
)

func TestVersionFlag(t *testing.T) {
	mm := regexp.MustCompile(`^v(\d+)\.(\d+)`).FindStringSubmatch(version)
	if mm == nil {
		t.Fatalf("version %q does not start with vMAJOR.MINOR", version)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--version"}, "kproxy " + version + "\n"},
		{[]string{"--version=true"}, "kproxy " + version + "\n"},
		{[]string{"--version=raw"}, `version.Info{Major:"` + mm[1] + `", Minor:"` + mm[2] + `", EmulationMajor:"", EmulationMinor:"", MinCompatibilityMajor:"", MinCompatibilityMinor:"", GitVersion:"` + version + `"`},
	} {
		out, _, err := execute(t, tt.args...)
		if err != nil {
			t.Fatalf("%v: %v", tt.args, err)
		}
		if !strings.HasPrefix(out, tt.want) {
			t.Errorf("%v printed %q, want it to start with %q", tt.args, out, tt.want)
		}
	}
	if _, _, err := execute(t, "--version=maybe"); err == nil {
		t.Error("--version=maybe was accepted")
	}
}

// --write-config-to writes the effective configuration (flags included,
// underscore spellings normalised) and exits without running the proxy.
func TestWriteConfigToAndUnderscoreFlags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.yaml")
	out, stderr, err := execute(t, "--write-config-to", path, "--cluster_cidr", "198.18.0.0/16", "--proxy_mode=nftables", "--conntrack_tcp_timeout_close_wait=2m")
	if err != nil {
		t.Fatalf("%v\n%s%s", err, out, stderr)
	}
	c, err := config.LoadConfigFile(path)
	if err != nil {
		t.Fatalf("reading what --write-config-to wrote: %v", err)
	}
	if c.ClusterCIDR != "198.18.0.0/16" || c.Mode != "nftables" || c.Conntrack.TCPCloseWaitTimeout.Duration != 2*time.Minute {
		t.Errorf("written config: clusterCIDR %q mode %q closeWait %v", c.ClusterCIDR, c.Mode, c.Conntrack.TCPCloseWaitTimeout)
	}
	if *c.OOMScoreAdj != config.DefaultOOMScoreAdj {
		t.Errorf("written config lost the defaults: oomScoreAdj %d", *c.OOMScoreAdj)
	}
}

func TestNFTablesLocalhostNodePortsGateRefused(t *testing.T) {
	_, _, err := execute(t, "--proxy-mode", "nftables", "--hostname-override", "node-a", "--feature-gates", "KubeProxyNFTablesLocalhostNodePorts=true")
	var ue usageError
	if !asUsage(err, &ue) || !strings.Contains(err.Error(), "KubeProxyNFTablesLocalhostNodePorts") {
		t.Fatalf("got %v, want a usage error naming the gate", err)
	}
	c := config.NewOptions().Config
	c.FeatureGates = map[string]bool{"KubeProxyNFTablesLocalhostNodePorts": true}
	if err := checkSupported(c, config.ModeIPTables); err != nil {
		t.Errorf("iptables mode with the gate: %v", err)
	}
	c.FeatureGates = nil
	if err := checkSupported(c, config.ModeNFTables); err != nil {
		t.Errorf("nftables mode without the gate: %v", err)
	}
}

func TestInitSteps(t *testing.T) {
	kernel := func() *sysctltest.Fake {
		return sysctltest.New(map[string]int{
			conntrack.MaxPath: 65536, conntrack.HashsizePath: 16384,
			conntrack.TCPEstablishedTimeoutPath: 432000, conntrack.TCPCloseWaitTimeoutPath: 60,
			conntrack.TCPBeLiberalPath: 0, conntrack.UDPTimeoutPath: 30, conntrack.UDPStreamTimeoutPath: 120,
			"/proc/sys/net/ipv4/conf/all/route_localnet": 0,
		})
	}
	c := config.NewOptions().Config
	for _, tt := range []struct {
		name     string
		mode     string
		initOnly bool
		writes   []string
	}{
		{"nftables", config.ModeNFTables, true, []string{
			conntrack.MaxPath + "=131072", conntrack.HashsizePath + "=32768",
			conntrack.TCPEstablishedTimeoutPath + "=86400", conntrack.TCPCloseWaitTimeoutPath + "=3600"}},
		{"iptables init-only: route_localnet too", config.ModeIPTables, true, []string{
			conntrack.MaxPath + "=131072", conntrack.HashsizePath + "=32768",
			conntrack.TCPEstablishedTimeoutPath + "=86400", conntrack.TCPCloseWaitTimeoutPath + "=3600",
			"/proc/sys/net/ipv4/conf/all/route_localnet=1"}},
		{"iptables running: route_localnet left to the iptables set-up", config.ModeIPTables, false, []string{
			conntrack.MaxPath + "=131072", conntrack.HashsizePath + "=32768",
			conntrack.TCPEstablishedTimeoutPath + "=86400", conntrack.TCPCloseWaitTimeoutPath + "=3600"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			k := kernel()
			err := initSteps(context.Background(), c, tt.mode, "node-a", config.Families(c, true), tt.initOnly, initEnv{sys: k, numCPU: 2})
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tt.writes, k.Writes); d != "" {
				t.Errorf("writes (-want +got):\n%s", d)
			}
		})
	}
	// route_localnet already 1 (an earlier --init-only run): not written
	// again, so that a read-only /proc/sys does not matter.
	k := kernel()
	k.Values["/proc/sys/net/ipv4/conf/all/route_localnet"] = 1
	k.ReadOnly["/proc/sys/net/ipv4/conf/all/route_localnet"] = true
	if err := initSteps(context.Background(), c, config.ModeIPTables, "node-a", []v1.IPFamily{model.IPv4}, true, initEnv{sys: k, numCPU: 2}); err != nil {
		t.Errorf("route_localnet already set: %v", err)
	}
	// A failure names what could not be done.
	k = kernel()
	k.ReadOnly[conntrack.MaxPath] = true
	err := initSteps(context.Background(), c, config.ModeNFTables, "node-a", []v1.IPFamily{model.IPv4}, true, initEnv{sys: k, numCPU: 2})
	if err == nil || !strings.Contains(err.Error(), "could not set conntrack parameters") {
		t.Errorf("read-only nf_conntrack_max: %v", err)
	}
}

func TestApplyOOMScoreAdj(t *testing.T) {
	path := filepath.Join(t.TempDir(), "oom_score_adj")
	if err := os.WriteFile(path, []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := config.NewOptions().Config
	applyOOMScoreAdj(c, path)
	if b, _ := os.ReadFile(path); string(b) != "-999" {
		t.Errorf("oom_score_adj = %q, want -999 (the default)", b)
	}
	*c.OOMScoreAdj = 500
	applyOOMScoreAdj(c, path)
	if b, _ := os.ReadFile(path); string(b) != "500" {
		t.Errorf("oom_score_adj = %q, want 500", b)
	}
}

// TestRouteLocalnetDecision: an --init-only run turns route_localnet on
// exactly when the running proxier would (upstream's NewProxier decides it
// in both), whatever nodePortAddresses says.
func TestRouteLocalnetDecision(t *testing.T) {
	for _, tt := range []struct {
		name      string
		addrs     []string
		localhost bool
		want      bool
	}{
		{"default: every address", nil, true, true},
		{"localhostNodePorts off", nil, false, false},
		{"primary: the node's own address", []string{"primary"}, true, false},
		{"loopback listed", []string{"127.0.0.0/8"}, true, true},
		{"other addresses only", []string{"198.18.0.0/16"}, true, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := config.NewOptions().Config
			c.NodePortAddresses = tt.addrs
			c.IPTables.LocalhostNodePorts = &tt.localhost
			opts := iptables.NewOptions(c, model.IPv4, "node-a")
			if got := opts.NeedsRouteLocalnet(); got != tt.want {
				t.Errorf("NeedsRouteLocalnet = %v, want %v", got, tt.want)
			}
			k := sysctltest.New(map[string]int{
				conntrack.MaxPath: 131072, conntrack.HashsizePath: 32768,
				conntrack.TCPEstablishedTimeoutPath: 86400, conntrack.TCPCloseWaitTimeoutPath: 3600,
				conntrack.TCPBeLiberalPath: 0, conntrack.UDPTimeoutPath: 30, conntrack.UDPStreamTimeoutPath: 120,
				"/proc/sys/net/ipv4/conf/all/route_localnet": 0,
			})
			if err := initSteps(context.Background(), c, config.ModeIPTables, "node-a", []v1.IPFamily{model.IPv4}, true, initEnv{sys: k, numCPU: 2}); err != nil {
				t.Fatal(err)
			}
			wrote := slices.Contains(k.Writes, "/proc/sys/net/ipv4/conf/all/route_localnet=1")
			if wrote != tt.want {
				t.Errorf("--init-only wrote route_localnet: %v, want %v (writes %v)", wrote, tt.want, k.Writes)
			}
		})
	}
}
