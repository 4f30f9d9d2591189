package compat

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/test/e2e/framework"
)

// proxyConfig is one real-world way of running kube-proxy.
type proxyConfig struct {
	name string
	// file is the KubeProxyConfiguration ("" for flags only); KUBECONFIG
	// is replaced by the kubeconfig's path.
	file string
	// args are the flags besides --hostname-override (and --config).
	args []string
	// metrics: compare the metric families after the first sync.
	metrics bool
}

// kubeadmConfig is the config.conf kubeadm v1.37 writes into the
// kube-proxy ConfigMap (kubeadm's defaults; podSubnet set), with mode MODE.
const kubeadmConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: KUBECONFIG
  qps: 0
clusterCIDR: 198.18.128.0/17,fd00:18:128::/64
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
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: ""
mode: MODE
nftables:
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
nodePortAddresses: null
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
`

var liveConfigs = []proxyConfig{
	{name: "kubeadm-iptables", file: strings.Replace(kubeadmConfig, "MODE", `""`, 1), metrics: true},
	{name: "kubeadm-nftables", file: strings.Replace(kubeadmConfig, "MODE", "nftables", 1), metrics: true},
	{name: "unknown-fields", file: strings.Replace(kubeadmConfig, "MODE", "nftables", 1) +
		"someFutureField: 1\nconntrackExtra:\n  x: y\n"},
	{name: "duplicate-fields", file: strings.Replace(kubeadmConfig, "MODE", "iptables", 1) + "mode: nftables\n"},
	// RKE2 v1.37's kube-proxy static pod arguments (no config file).
	{name: "rke2-flags", args: []string{
		"--cluster-cidr=198.18.128.0/17", "--conntrack-max-per-core=0",
		"--conntrack-tcp-timeout-close-wait=0s", "--conntrack-tcp-timeout-established=0s",
		"--healthz-bind-address=127.0.0.1", "--kubeconfig=KUBECONFIG", "--proxy-mode=iptables",
	}},
}

// node is one proxy's side: its namespace and Node name.
type node struct {
	binName, bin, ns, name string
}

func testLive(t *testing.T) {
	needRoot(t)
	cp := framework.Start(t, framework.Options{})
	// Admin: both binaries read the same objects whatever RBAC the
	// harness grants system:kube-proxy (ServiceCIDRs among them).
	kubeconfig := cp.AdminKubeconfig
	var nodes [2]node
	for i, n := range []node{{binName: "kube-proxy", bin: upstreamBin, name: "compat-up"}, {binName: "kproxy", bin: kproxyBin, name: "compat-kp"}} {
		n.ns = framework.AddNamespace(t, "kpe2e-"+n.name)
		link := cp.ConnectNamespace(t, n.ns)
		var addrs []netip.Addr
		for _, p := range link.Addrs {
			addrs = append(addrs, p.Addr())
		}
		cp.CreateNode(t, n.name, addrs...)
		nodes[i] = n
	}
	createRuleServices(t, cp)
	dir := t.TempDir()
	for _, c := range liveConfigs {
		t.Run(c.name, func(t *testing.T) { runConfig(t, cp, dir, kubeconfig, nodes, c) })
	}
	sectionDone(kindField)
	sectionDone(kindMetric)
	sectionDone(kindEndpoint)
	t.Run("events", func(t *testing.T) { compareEvents(t, cp, nodes) })
	t.Run("init-only", func(t *testing.T) { compareInitOnly(t, cp, dir, kubeconfig) })
	// Last: it deletes the Nodes.
	t.Run("node-deleting", func(t *testing.T) { compareNodeDeleting(t, cp, dir, kubeconfig, nodes) })
	t.Run("node-missing", func(t *testing.T) { compareNodeMissing(t, dir, kubeconfig, nodes) })
}

// compareNodeMissing compares the health answers when no Node object of the
// proxy's name exists (upstream waits 30s for its addresses, then runs on).
func compareNodeMissing(t *testing.T, dir, kubeconfig string, nodes [2]node) {
	c := liveConfigs[1] // kubeadm, nftables
	c.name = "node-missing"
	for _, n := range nodes {
		n.name = "compat-missing"
		p := start(t, dir, kubeconfig, n, c)
		defer func() { _ = p.Stop() }()
	}
	for _, n := range nodes {
		if !waitFor(60*time.Second, func() bool { code, _ := get(n.ns, "http://127.0.0.1:10256/livez"); return code != 0 }) {
			t.Fatalf("%s: no health server within 60s", n.binName)
		}
	}
	for _, path := range []string{"healthz", "livez"} {
		t.Run(path, func(t *testing.T) {
			var got [2]string
			for i, n := range nodes {
				code, body := get(n.ns, "http://127.0.0.1:10256/"+path)
				got[i] = fmt.Sprint(code) + " " + healthShape(body)
			}
			compare(t, kindEndpoint, "10256/"+path+" (Node missing)", ":10256/"+path+" (Node missing)", got[0], got[1])
		})
	}
}

// compareNodeDeleting compares the health answers while the Node is being
// deleted (a finalizer holds it, as during a drain by an autoscaler).
func compareNodeDeleting(t *testing.T, cp *framework.ControlPlane, dir, kubeconfig string, nodes [2]node) {
	c := liveConfigs[1] // kubeadm, nftables
	c.name = "node-deleting"
	for _, n := range nodes {
		p := start(t, dir, kubeconfig, n, c)
		defer func() { _ = p.Stop() }()
	}
	for _, n := range nodes {
		if !waitFor(60*time.Second, func() bool {
			code, body := get(n.ns, "http://127.0.0.1:10249/metrics")
			return code == 200 && syncedOnce(body)
		}) {
			t.Fatalf("%s: no first sync within 60s", n.binName)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const finalizer = "kproxy.test/compat"
	for _, n := range nodes {
		patch := []byte(`{"metadata":{"finalizers":["` + finalizer + `"]}}`)
		if _, err := cp.Client.CoreV1().Nodes().Patch(ctx, n.name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatalf("adding finalizer to %s: %v", n.name, err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, _ = cp.Client.CoreV1().Nodes().Patch(ctx, n.name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
		})
		if err := cp.Client.CoreV1().Nodes().Delete(ctx, n.name, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("deleting %s: %v", n.name, err)
		}
	}
	// Both watch their Node; give the deletion timestamp time to arrive
	// (bounded), then compare.
	for _, n := range nodes {
		waitFor(10*time.Second, func() bool { code, _ := get(n.ns, "http://127.0.0.1:10256/healthz"); return code == 503 })
	}
	for _, path := range []string{"healthz", "livez"} {
		t.Run(path, func(t *testing.T) {
			var got [2]string
			for i, n := range nodes {
				code, body := get(n.ns, "http://127.0.0.1:10256/"+path)
				got[i] = fmt.Sprint(code) + " " + healthShape(body)
			}
			compare(t, kindEndpoint, "10256/"+path+" (Node being deleted)", ":10256/"+path+" (Node being deleted)", got[0], got[1])
		})
	}
}

// start runs one binary with c on its node and returns the process.
func start(t *testing.T, dir, kubeconfig string, n node, c proxyConfig) *framework.Process {
	args := []string{n.bin, "--hostname-override=" + n.name}
	if c.file != "" {
		path := filepath.Join(dir, c.name+".yaml")
		if err := os.WriteFile(path, []byte(strings.ReplaceAll(c.file, "KUBECONFIG", kubeconfig)), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--config="+path)
	}
	for _, a := range c.args {
		args = append(args, strings.ReplaceAll(a, "KUBECONFIG", kubeconfig))
	}
	return framework.StartProcess(t, n.ns, dir, c.name+"-"+n.binName, args...)
}

// get fetches url inside ns; status 0 when nothing answers.
func get(ns, url string) (int, string) {
	resp, err := framework.HTTPClientIn(ns).Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	return resp.StatusCode, string(b)
}

// waitFor polls f every 200ms until it says done, for at most d.
func waitFor(d time.Duration, f func() bool) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if f() {
			return true
		}
		time.Sleep(200 * time.Millisecond)
	}
	return f()
}

func runConfig(t *testing.T, cp *framework.ControlPlane, dir, kubeconfig string, nodes [2]node, c proxyConfig) {
	var procs [2]*framework.Process
	for i, n := range nodes {
		procs[i] = start(t, dir, kubeconfig, n, c)
	}
	defer func() {
		for _, p := range procs {
			_ = p.Stop()
		}
	}()
	// Both have synced once: the sync timestamp metric is set.
	var metrics [2]string
	for i, n := range nodes {
		ok := waitFor(60*time.Second, func() bool {
			code, body := get(n.ns, "http://127.0.0.1:10249/metrics")
			metrics[i] = body
			return code == 200 && syncedOnce(body)
		})
		if !ok {
			t.Fatalf("%s with %s: no first sync within 60s; log:\n%s", n.binName, c.name, procs[i].Tail(30))
		}
	}
	t.Run("configz", func(t *testing.T) {
		var fields [2]map[string]string
		for i, n := range nodes {
			code, body := get(n.ns, "http://127.0.0.1:10249/configz")
			if code != 200 {
				t.Fatalf("%s /configz: %d %s", n.binName, code, body)
			}
			body = strings.ReplaceAll(body, n.name, "NODE")
			var v map[string]any
			if err := json.Unmarshal([]byte(body), &v); err != nil {
				t.Fatalf("%s /configz: %v\n%s", n.binName, err, body)
			}
			fields[i] = map[string]string{}
			// {"kubeproxy.config.k8s.io": {...}}: paths start inside.
			for k, e := range v {
				if k == "kubeproxy.config.k8s.io" {
					flatten("", e, fields[i])
				} else {
					flatten(k, e, fields[i])
				}
			}
		}
		for _, f := range unionKeys(fields[0], fields[1]) {
			t.Run(f, func(t *testing.T) {
				compare(t, kindField, c.name+"/"+f, f, orAbsent(fields[0], f), orAbsent(fields[1], f))
			})
		}
	})
	if c.metrics {
		t.Run("metrics", func(t *testing.T) {
			up, kp := families(metrics[0]), families(metrics[1])
			for _, f := range unionKeys(up, kp) {
				t.Run(f, func(t *testing.T) {
					compare(t, kindMetric, f, f, orAbsent(up, f), orAbsent(kp, f))
				})
			}
		})
		t.Run("endpoints", func(t *testing.T) { compareEndpoints(t, nodes) })
	}
	if c.name == rulesConfig {
		t.Run("iptables-save", func(t *testing.T) { compareRules(t, nodes) })
	}
}

// syncedOnce reports whether a /metrics text shows a finished sync.
func syncedOnce(body string) bool {
	for _, l := range strings.Split(body, "\n") {
		// Upstream labels it with ip_family.
		if (strings.HasPrefix(l, "kubeproxy_sync_proxy_rules_last_timestamp_seconds ") ||
			strings.HasPrefix(l, "kubeproxy_sync_proxy_rules_last_timestamp_seconds{")) &&
			!strings.HasSuffix(l, " 0") {
			return true
		}
	}
	return false
}

func orAbsent(m map[string]string, k string) string {
	if v, ok := m[k]; ok {
		return v
	}
	return "absent"
}

func unionKeys(a, b map[string]string) []string {
	seen := map[string]bool{}
	for k := range a {
		seen[k] = true
	}
	for k := range b {
		seen[k] = true
	}
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// flatten turns a JSON value into path -> JSON text of its leaves (lists
// are leaves).
func flatten(prefix string, v any, out map[string]string) {
	if m, ok := v.(map[string]any); ok && len(m) > 0 {
		for k, e := range m {
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			flatten(p, e, out)
		}
		return
	}
	b, _ := json.Marshal(v)
	out[prefix] = string(b)
}

// families reads Prometheus text: family -> "type labels=a,b".
func families(body string) map[string]string {
	types := map[string]string{}
	labels := map[string]map[string]bool{}
	cur := ""
	for _, l := range strings.Split(body, "\n") {
		if f := strings.Fields(l); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			cur = f[2]
			types[cur] = f[3]
			labels[cur] = map[string]bool{}
			continue
		}
		if l == "" || strings.HasPrefix(l, "#") || cur == "" {
			continue
		}
		if i := strings.IndexByte(l, '{'); i >= 0 {
			for _, kv := range splitLabels(l[i+1 : strings.LastIndexByte(l, '}')]) {
				labels[cur][kv] = true
			}
		}
	}
	out := map[string]string{}
	for f, typ := range types {
		var ls []string
		for l := range labels[f] {
			ls = append(ls, l)
		}
		sort.Strings(ls)
		out[f] = typ + " labels=" + strings.Join(ls, ",")
	}
	return out
}

// splitLabels returns the label names of `a="x",b="y"`, minding quotes.
func splitLabels(s string) []string {
	var names []string
	inQuote, start := false, 0
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && inQuote:
			i++
		case s[i] == '"':
			inQuote = !inQuote
		case s[i] == '=' && !inQuote:
			names = append(names, strings.TrimLeft(s[start:i], ", "))
		case s[i] == ',' && !inQuote:
			start = i + 1
		}
	}
	return names
}

// endpoints are the paths compared on each port: status code, and for the
// health answers their JSON keys and nodeEligible.
var endpoints = []string{
	"10249/metrics", "10249/configz", "10249/proxyMode", "10249/healthz", "10249/livez",
	"10249/metrics/slis", "10249/flagz", "10249/statusz", "10249/debug/pprof/",
	"10256/healthz", "10256/livez", "10256/",
}

func compareEndpoints(t *testing.T, nodes [2]node) {
	for _, ep := range endpoints {
		t.Run(ep, func(t *testing.T) {
			var got [2]string
			for i, n := range nodes {
				port, path, _ := strings.Cut(ep, "/")
				code, body := get(n.ns, "http://127.0.0.1:"+port+"/"+path)
				got[i] = fmt.Sprint(code)
				if path == "healthz" || path == "livez" {
					got[i] += " " + healthShape(body)
				}
			}
			compare(t, kindEndpoint, ep, ":"+ep, got[0], got[1])
		})
	}
}

// healthShape is what an operator's probe or script reads in a health
// answer: its JSON keys and nodeEligible (times differ, of course).
func healthShape(body string) string {
	var m map[string]any
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		return "not JSON: " + strings.TrimSpace(body)
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return fmt.Sprintf("keys=%s nodeEligible=%v", strings.Join(keys, ","), m["nodeEligible"])
}

// compareEvents compares the Event reasons each binary recorded for its
// Node over all the runs.
func compareEvents(t *testing.T, cp *framework.ControlPlane, nodes [2]node) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var reasons [2]map[string]string
	for i, n := range nodes {
		reasons[i] = map[string]string{}
		evs, err := cp.Client.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + n.name})
		if err != nil {
			t.Fatalf("listing events: %v", err)
		}
		for _, e := range evs.Items {
			reasons[i][e.Reason] = "recorded (" + e.Type + ")"
		}
	}
	for _, r := range unionKeys(reasons[0], reasons[1]) {
		t.Run(r, func(t *testing.T) {
			compare(t, kindEvent, r, r, orAbsent(reasons[0], r), orAbsent(reasons[1], r))
		})
	}
	sectionDone(kindEvent)
}
