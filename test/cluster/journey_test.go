package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kproxy/kproxy/test/e2e/framework"
)

// The operator's journeys of docs/rke2.md, run on the suite's cluster with
// the docs' own commands (kubectl in the control plane's namespace, ctr on
// a node's containerd socket). Each ends in checkServices. Install is
// kproxyCluster's deployment, checked by TestServiceFromEveryNode.

// maxProbeFailures is how many of the prober's requests may fail while
// kproxy changes mode node by node. docs/rke2.md (section 5) promises no
// failing window: the old rules serve until the new ones are in place.
const maxProbeFailures = 2

// kproxyNS is where deploy/kproxy.yaml puts kproxy.
const kproxyNS = "kube-system"

// TestJourneyModeChange: kproxy installed in iptables mode, then moved to
// nftables mode exactly as docs/rke2.md section 5 ("Between kproxy's
// modes") writes it: the config under a new name (kproxy-config-v2), the
// DaemonSet's volume pointed at it, `rollout status`; while a prober sends
// requests to the Services all the time, from a pod on every node, from
// every node and from outside. At the end every node runs nftables mode
// with its tables in place, no kube-proxy chain is left in either iptables
// backend, the Services answer everywhere, and at most maxProbeFailures
// requests failed.
func TestJourneyModeChange(t *testing.T) {
	c := kproxyCluster(t)
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	clusterIP, nodePort := serviceFixture(t, c)

	// The start: kproxy installed in iptables mode (section 2 with mode:
	// iptables). The suite's DaemonSet goes first, with its pods, so that
	// the ConfigMap edited here is read by no running pod.
	if _, err := c.Kubectl(ctx, "-n", kproxyNS, "delete", "daemonset", "kproxy", "--cascade=foreground", "--timeout=2m"); err != nil {
		t.Fatal(err)
	}
	if err := c.ApplyKproxy(ctx, "iptables"); err != nil {
		t.Fatal(err)
	}
	checkServices(t, c)
	for _, n := range c.Nodes {
		if _, err := framework.RunIn(ctx, n.Namespace, "nft", "list", "table", "ip", "kube-proxy"); err == nil {
			t.Errorf("node %s: nftables mode's table is left in iptables mode", n.Name)
		}
	}
	checkDoctorTrace(t, c, c.Nodes[0], "iptables")
	t.Logf("kproxy in iptables mode after %s", time.Since(began).Round(time.Second))

	_, clients := servicePods(ctx, t, c)
	p := startProber(c, clusterIP, nodePort, clients)
	t.Cleanup(p.stop)

	// Section 5's commands, one for one. kubectl runs in the control
	// plane's namespace, so the file is named by its absolute path; its
	// base name (the ConfigMap's key) is config.conf as in the docs.
	changed := time.Now()
	conf := filepath.Join(t.TempDir(), "config.conf")
	out, err := c.Kubectl(ctx, "-n", kproxyNS, "get", "configmap", "kproxy-config-v1", "-o", `jsonpath={.data.config\.conf}`)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(out, "\nmode: iptables\n") != 1 {
		t.Fatalf("kproxy-config-v1 has no single line mode: iptables:\n%s", out)
	}
	if err := os.WriteFile(conf, []byte(strings.Replace(out, "\nmode: iptables\n", "\nmode: nftables\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"-n", kproxyNS, "create", "configmap", "kproxy-config-v2", "--from-file=" + conf},
		{"-n", kproxyNS, "label", "configmap", "kproxy-config-v2", "app.kubernetes.io/name=kproxy"},
		{"-n", kproxyNS, "patch", "daemonset", "kproxy", "-p", `{"spec":{"template":{"spec":{"volumes":[{"name":"kproxy-config","configMap":{"name":"kproxy-config-v2"}}]}}}}`},
	} {
		if _, err := c.Kubectl(ctx, args...); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.RolloutStatus(ctx, kproxyNS, "daemonset/kproxy", 4*time.Minute); err != nil {
		t.Fatal(err)
	}
	rolled := time.Since(changed)

	// Every node: the new config, nftables mode, and the iptables mode's
	// chains removed after the first sync (within seconds: eventually).
	for _, n := range c.Nodes {
		pod := kproxyPod(ctx, t, c, n)
		vol, err := c.Kubectl(ctx, "-n", kproxyNS, "get", pod, "-o", `jsonpath={.spec.volumes[?(@.name=="kproxy-config")].configMap.name}`)
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(vol) != "kproxy-config-v2" {
			t.Errorf("node %s: %s mounts %q, want kproxy-config-v2", n.Name, pod, vol)
		}
		logs, err := c.Kubectl(ctx, "-n", kproxyNS, "logs", pod)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(logs, "Using nftables Proxier") {
			t.Errorf("node %s: %s never logged Using nftables Proxier:\n%s", n.Name, pod, TailLines(logs, 20))
		}
		if _, err := framework.RunIn(ctx, n.Namespace, "nft", "list", "table", "ip", "kube-proxy"); err != nil {
			t.Errorf("node %s: nft list table ip kube-proxy: %v", n.Name, err)
		}
		checkCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		eventually(checkCtx, t, "node "+n.Name+": no kube-proxy chains in either iptables backend", func() (string, error) {
			return "", noKubeProxyChains(checkCtx, n)
		})
		cancel()
	}
	checkServices(t, c)
	// "Delete the old ConfigMap only when the new one has reached every
	// node."
	if _, err := c.Kubectl(ctx, "-n", kproxyNS, "delete", "configmap", "kproxy-config-v1"); err != nil {
		t.Fatal(err)
	}
	p.stop()
	sent, failed, samples := p.result()
	t.Logf("mode change iptables → nftables rolled out over %d nodes in %s; prober: %d requests, %d failed %v",
		len(c.Nodes), rolled.Round(time.Second), sent, failed, samples)
	if sent < 100 {
		t.Errorf("the prober sent only %d requests", sent)
	}
	if failed > maxProbeFailures {
		t.Errorf("%d of %d requests failed during the mode change (at most %d allowed): %v", failed, sent, maxProbeFailures, samples)
	}
	t.Logf("journey done in %s", time.Since(began).Round(time.Second))
}

// TestJourneyDoctorTrace: `kproxy doctor` and `kproxy trace --live` run
// inside the kproxy pod of a node, as section 4 says, and answer for that
// node (checkDoctorTrace).
func TestJourneyDoctorTrace(t *testing.T) {
	c := kproxyCluster(t)
	checkDoctorTrace(t, c, c.Nodes[len(c.Nodes)-1], "nftables")
}

// kproxyPod is the kproxy pod on node n ("pod/NAME"), found as section 4
// finds it: by its label and a field selector on the node.
func kproxyPod(ctx context.Context, t *testing.T, c *Cluster, n *Node) string {
	t.Helper()
	out, err := c.Kubectl(ctx, "-n", kproxyNS, "get", "pod", "-l", "app.kubernetes.io/name=kproxy",
		"--field-selector", "spec.nodeName="+n.Name, "-o", "name")
	if err != nil {
		t.Fatal(err)
	}
	pods := strings.Fields(out)
	if len(pods) != 1 {
		t.Fatalf("kproxy pods on %s: %q, want one", n.Name, out)
	}
	return pods[0]
}

// noKubeProxyChains reports kube-proxy's service chains left in either
// iptables backend of node n.
func noKubeProxyChains(ctx context.Context, n *Node) error {
	for _, save := range []string{"iptables-legacy-save", "iptables-nft-save"} {
		out, err := framework.RunIn(ctx, n.Namespace, save)
		if err != nil {
			return err
		}
		for _, chain := range []string{"KUBE-SERVICES", "KUBE-SVC-", "KUBE-SEP-", "KUBE-NODEPORTS", "KUBE-POSTROUTING"} {
			if strings.Contains(out, ":"+chain) {
				return fmt.Errorf("%s shows %s chains", save, chain)
			}
		}
	}
	return nil
}

var traceOutcome = regexp.MustCompile(`(?m)^outcome \d+/\d+ \(p=[^)]*\): accept, dnat to ([0-9.]+):(\d+)`)

// checkDoctorTrace runs, inside the kproxy pod of node n (`kubectl exec`
// on the pod section 4 selects), `kproxy doctor`, which must exit 0 (no
// error found), name the mode and backend that run and find no rules of
// another mode; and `kproxy trace --live` for a packet from the client
// pod on n to the services fixture's ClusterIP, which must reach exactly
// the fixture's backends and name the Service port: in iptables mode in the
// rules' comments, in nftables mode after each step taken for it (the
// comment of the map element that dispatched it), the DNAT of every
// outcome included.
func checkDoctorTrace(t *testing.T, c *Cluster, n *Node, mode string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	clusterIP, _ := serviceFixture(t, c)
	backends, clients := servicePods(ctx, t, c)
	pod := kproxyPod(ctx, t, c, n)

	doctor, err := c.Kubectl(ctx, "-n", kproxyNS, "exec", pod, "--", "kproxy", "doctor")
	if err != nil {
		t.Fatalf("kproxy doctor on %s: %v", n.Name, err)
	}
	t.Logf("kproxy doctor on %s:\n%s", n.Name, doctor)
	// The iptables backend this cluster's iptables mode picks is nft: the
	// kubelets write KUBE-IPTABLES-HINT there.
	wants := map[string][]string{
		"nftables": {"a proxy answers on /proxyMode: nftables (backend nftables)", "nftables mode tables: ip kube-proxy, ip kube-proxy-s0"},
		"iptables": {"a proxy answers on /proxyMode: iptables (backend nft)", "nftables mode tables: none"},
	}[mode]
	for _, want := range wants {
		if !strings.Contains(doctor, want) {
			t.Errorf("kproxy doctor on %s (%s mode) lacks %q", n.Name, mode, want)
		}
	}
	for _, line := range strings.Split(doctor, "\n") {
		if strings.HasPrefix(line, "ERROR") || strings.Contains(line, "several proxy modes") || strings.Contains(line, "BOTH iptables backends") {
			t.Errorf("kproxy doctor on %s: %s", n.Name, line)
		}
	}

	src := clients[n.Name]
	trace, err := c.Kubectl(ctx, "-n", kproxyNS, "exec", pod, "--", "kproxy", "trace", "--live",
		"--src", src, "--iif", "cni0", "--dst", clusterIP.String())
	if err != nil {
		t.Fatalf("kproxy trace on %s: %v", n.Name, err)
	}
	t.Logf("kproxy trace --live on %s from %s to %s:\n%s", n.Name, src, clusterIP, TailLines(trace, 60))
	reached := map[string]bool{}
	outcomes := traceOutcome.FindAllStringSubmatch(trace, -1)
	for _, m := range outcomes {
		if m[2] != "8080" {
			t.Errorf("trace on %s: dnat to port %s, want the target port 8080", n.Name, m[2])
		}
		reached[m[1]] = true
	}
	want := map[string]bool{}
	for _, ip := range backends {
		want[ip] = true
	}
	if fmt.Sprint(keys(reached)) != fmt.Sprint(keys(want)) {
		t.Errorf("trace on %s reaches %v, want the backends %v", n.Name, keys(reached), keys(want))
	}
	if !strings.Contains(trace, svcNamespace+"/backend:http") {
		t.Errorf("trace on %s names no Service %s/backend:http", n.Name, svcNamespace)
	}
	if mode == "nftables" {
		dnat := regexp.MustCompile(`(?m)^ +\S+: .* dnat to [0-9.]+:8080, accept \(service ` + regexp.QuoteMeta(svcNamespace+"/backend:http/TCP") + `\)$`)
		if got := len(dnat.FindAllString(trace, -1)); got != len(outcomes) {
			t.Errorf("trace on %s: %d DNAT steps name the Service %s/backend:http/TCP, want one per outcome (%d)", n.Name, got, svcNamespace, len(outcomes))
		}
	}
}

// prober sends requests to the services fixture without a pause, along
// every path checkServices checks, and counts those that fail.
type prober struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu           sync.Mutex
	sent, failed int
	samples      []string // the first failures, with their time
}

// startProber starts probing: each round, from each node the ClusterIP,
// from the control plane every node's NodePort, and through the client
// pod on each node (its /dial) the ClusterIP.
func startProber(c *Cluster, clusterIP netip.AddrPort, nodePort uint16, clients map[string]string) *prober {
	ctx, cancel := context.WithCancel(context.Background())
	p := &prober{cancel: cancel, done: make(chan struct{})}
	type probe struct {
		name string
		do   func(context.Context) error
	}
	var probes []probe
	outside := framework.HTTPClientIn(c.CP.Namespace)
	outside.Timeout = 3 * time.Second
	for _, n := range c.Nodes {
		node := framework.HTTPClientIn(n.Namespace)
		node.Timeout = 3 * time.Second
		nodePortAddr := netip.AddrPortFrom(n.IP, nodePort)
		dial := dialURL(clients[n.Name], clusterIP)
		probes = append(probes,
			probe{"node " + n.Name + " → " + clusterIP.String(), func(ctx context.Context) error {
				_, err := get(ctx, node, "http://"+clusterIP.String()+"/hostname")
				return err
			}},
			probe{"outside → " + nodePortAddr.String(), func(ctx context.Context) error {
				_, err := get(ctx, outside, "http://"+nodePortAddr.String()+"/hostname")
				return err
			}},
			probe{"pod on " + n.Name + " → " + clusterIP.String(), func(ctx context.Context) error {
				body, err := get(ctx, outside, dial)
				if err == nil && !strings.Contains(body, `"responses":["`) {
					err = fmt.Errorf("no answer: %s", body)
				}
				return err
			}},
		)
	}
	go func() {
		defer close(p.done)
		for ctx.Err() == nil {
			for _, pr := range probes {
				err := pr.do(ctx)
				if ctx.Err() != nil {
					return
				}
				p.mu.Lock()
				p.sent++
				if err != nil {
					p.failed++
					if len(p.samples) < 5 {
						p.samples = append(p.samples, fmt.Sprintf("%s %s: %v", time.Now().Format("15:04:05.000"), pr.name, err))
					}
				}
				p.mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return p
}

// stop ends the probing and waits for the last request.
func (p *prober) stop() {
	p.cancel()
	<-p.done
}

func (p *prober) result() (sent, failed int, samples []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sent, p.failed, append([]string(nil), p.samples...)
}

// longJourney is the cluster for the journeys that take a minute or more
// each (upgrade, uninstall, roll-back to upstream kube-proxy). They run
// in the suite: test/cluster runs beside test/e2e, which takes longer.
func longJourney(t *testing.T) *Cluster {
	t.Helper()
	return kproxyCluster(t)
}

// upgradeImage is the image TestJourneyUpgrade moves to: the kproxy
// archive's image with another version label and tag (upgradeArchive).
const upgradeVersion = "v0.1.0-upgrade"
const upgradeImage = "localhost/kproxy:" + upgradeVersion

// TestJourneyUpgrade: section 7's upgrade, with the
// prober running: the new image imported on every node (section 2's
// command), `set image`, `rollout status`; then `rollout undo` back to the
// image before, the same way. After each, every node's pod runs the image
// and the Services answer everywhere.
func TestJourneyUpgrade(t *testing.T) {
	c := longJourney(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	clusterIP, nodePort := serviceFixture(t, c)
	_, clients := servicePods(ctx, t, c)
	archive, err := KproxyArchive()
	if err != nil {
		t.Fatal(err)
	}
	newArchive := filepath.Join(t.TempDir(), "kproxy-upgrade.oci.tar")
	if err := upgradeArchive(ctx, archive, upgradeImage, upgradeVersion, newArchive); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		if err := ImportImage(ctx, c.Config.BinDir, n.Socket, newArchive); err != nil {
			t.Fatal(err)
		}
	}
	before := strings.TrimSpace(kubectl(ctx, t, c, "-n", kproxyNS, "get", "daemonset", "kproxy", "-o", "jsonpath={.spec.template.spec.containers[0].image}"))
	p := startProber(c, clusterIP, nodePort, clients)
	t.Cleanup(p.stop)
	for _, step := range []struct {
		args  []string
		image string
	}{
		{[]string{"-n", kproxyNS, "set", "image", "daemonset/kproxy", "kproxy=" + upgradeImage}, upgradeImage},
		{[]string{"-n", kproxyNS, "rollout", "undo", "daemonset", "kproxy"}, before},
	} {
		began := time.Now()
		kubectl(ctx, t, c, step.args...)
		if err := c.RolloutStatus(ctx, kproxyNS, "daemonset/kproxy", 4*time.Minute); err != nil {
			t.Fatal(err)
		}
		for _, n := range c.Nodes {
			pod := kproxyPod(ctx, t, c, n)
			got := kubectl(ctx, t, c, "-n", kproxyNS, "get", pod, "-o", "jsonpath={.status.containerStatuses[0].image}")
			if strings.TrimSpace(got) != step.image {
				t.Errorf("node %s: %s runs %q, want %q", n.Name, pod, got, step.image)
			}
		}
		t.Logf("kubectl %s: rolled out in %s", strings.Join(step.args[2:], " "), time.Since(began).Round(time.Second))
		checkServices(t, c)
	}
	p.stop()
	sent, failed, samples := p.result()
	t.Logf("prober: %d requests, %d failed %v", sent, failed, samples)
	if failed > maxProbeFailures {
		t.Errorf("%d of %d requests failed during the upgrade and its undo (at most %d allowed): %v", failed, sent, maxProbeFailures, samples)
	}
}

// TestJourneyUninstall: section 7's uninstall where
// another proxy takes over at once: the DaemonSet deleted, `kproxy
// --cleanup` from the image on every node (section 7's ctr command, with
// this cluster's ctr and a node's containerd socket for RKE2's), then
// kproxy's objects deleted. No kproxy or kube-proxy rule is left on any
// node and no kproxy object in the API. Then kproxy goes in again as
// section 2 says (the other proxy), and the Services answer everywhere.
func TestJourneyUninstall(t *testing.T) {
	c := longJourney(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	serviceFixture(t, c)
	kubectl(ctx, t, c, "-n", kproxyNS, "delete", "daemonset", "kproxy", "--cascade=foreground", "--timeout=2m")
	for _, n := range c.Nodes {
		kproxyCleanup(ctx, t, c, n)
	}
	// Section 7's commands. After TestJourneyModeChange, kproxy-config-v1
	// is gone: --ignore-not-found keeps that from being an error.
	manifest := filepath.Join(c.Config.VarDir(), "kproxy.yaml") // what was applied
	kubectl(ctx, t, c, "delete", "--ignore-not-found", "-f", manifest)
	kubectl(ctx, t, c, "-n", kproxyNS, "delete", "configmap", "-l", "app.kubernetes.io/name=kproxy")
	for _, n := range c.Nodes {
		checkNoProxyRules(ctx, t, n)
	}
	for _, kind := range []string{"daemonset", "configmap", "serviceaccount"} {
		if out := kubectl(ctx, t, c, "-n", kproxyNS, "get", kind, "-l", "app.kubernetes.io/name=kproxy", "-o", "name"); strings.TrimSpace(out) != "" {
			t.Errorf("left after the uninstall: %s", out)
		}
	}
	for _, kind := range []string{"clusterrole", "clusterrolebinding"} {
		if out := kubectl(ctx, t, c, "get", kind, "-l", "app.kubernetes.io/name=kproxy", "-o", "name"); strings.TrimSpace(out) != "" {
			t.Errorf("left after the uninstall: %s", out)
		}
	}
	if err := c.DeployKproxy(ctx, "nftables"); err != nil {
		t.Fatal(err)
	}
	checkServices(t, c)
}

// TestJourneyRollback: section 7's roll-back to
// kube-proxy, node by node. The DaemonSet gets the kproxy.io/enabled
// node selector (every node labelled first); then on each node: the label
// removed (kproxy's pod leaves), `kproxy --cleanup` from the image, and
// kube-proxy started there. RKE2 starts kube-proxy by writing its static
// pod when rke2-server/agent restarts without disable-kube-proxy; the
// Kubernetes-level equivalent here is kubeadm's kube-proxy DaemonSet
// (iptables mode, RKE2's default) selecting nodes labelled
// journey.kproxy.io/kube-proxy=true, and that label set on the node. The
// drain of steps 1 and 4 is left out: the services fixture's client pods
// are bare pods, which drain refuses (or deletes with --force), and the
// check after every node needs them. After every node the Services answer
// from every node (some on kproxy, some on kube-proxy); at the end no
// kproxy pod runs, no node holds an nftables table of kproxy, and kproxy's
// objects are removed (section 7's uninstall).
func TestJourneyRollback(t *testing.T) {
	c := longJourney(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	serviceFixture(t, c)

	kproxyArchive, err := KproxyArchive()
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(c.Config.VarDir(), "kube-proxy.oci.tar")
	if err := BuildKubeProxyImage(ctx, kproxyArchive, c.Config.BinDir, archive); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		if err := ImportImage(ctx, c.Config.BinDir, n.Socket, archive); err != nil {
			t.Fatal(err)
		}
	}
	const kubeProxyLabel = "journey.kproxy.io/kube-proxy"
	manifest, err := kubeProxyManifest("iptables")
	if err != nil {
		t.Fatal(err)
	}
	sel := "      nodeSelector:\n        kubernetes.io/os: linux\n"
	if strings.Count(manifest, sel) != 1 {
		t.Fatalf("kube-proxy's manifest has no single nodeSelector %q", sel)
	}
	manifest = strings.Replace(manifest, sel, sel+"        "+kubeProxyLabel+": \"true\"\n", 1)
	path := filepath.Join(c.Config.VarDir(), "kube-proxy.yaml")
	if err := os.WriteFile(path, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	kubectl(ctx, t, c, "apply", "-f", path)

	kubectl(ctx, t, c, "label", "node", "--all", "kproxy.io/enabled=true")
	kubectl(ctx, t, c, "-n", kproxyNS, "patch", "daemonset", "kproxy", "-p", `{"spec":{"template":{"spec":{"nodeSelector":{"kproxy.io/enabled":"true"}}}}}`)
	if err := c.RolloutStatus(ctx, kproxyNS, "daemonset/kproxy", 4*time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		began := time.Now()
		pod := kproxyPod(ctx, t, c, n)
		kubectl(ctx, t, c, "label", "node", n.Name, "kproxy.io/enabled-")
		kubectl(ctx, t, c, "-n", kproxyNS, "wait", "--for=delete", pod, "--timeout=2m")
		kproxyCleanup(ctx, t, c, n)
		kubectl(ctx, t, c, "label", "node", n.Name, kubeProxyLabel+"=true")
		if err := c.RolloutStatus(ctx, kproxyNS, "daemonset/kube-proxy", 3*time.Minute); err != nil {
			t.Fatal(err)
		}
		eventually(ctx, t, "kube-proxy's rules on "+n.Name, func() (string, error) {
			out, err := framework.RunIn(ctx, n.Namespace, "iptables-nft-save", "-t", "nat")
			if err != nil || !strings.Contains(out, ":KUBE-SERVICES") {
				return "", fmt.Errorf("no KUBE-SERVICES in iptables-nft-save (%v)", err)
			}
			return "", nil
		})
		t.Logf("node %s: kproxy → kube-proxy in %s", n.Name, time.Since(began).Round(time.Second))
		checkServices(t, c)
	}
	for _, n := range c.Nodes {
		if out, _ := framework.RunIn(ctx, n.Namespace, "nft", "list", "tables"); strings.Contains(out, "kube-proxy") {
			t.Errorf("node %s keeps nftables mode's tables under kube-proxy (iptables mode):\n%s", n.Name, out)
		}
	}
	kubectl(ctx, t, c, "delete", "--ignore-not-found", "-f", filepath.Join(c.Config.VarDir(), "kproxy.yaml"))
	kubectl(ctx, t, c, "-n", kproxyNS, "delete", "configmap", "-l", "app.kubernetes.io/name=kproxy")
	checkServices(t, c)
}

// kubectl runs kubectl in the cluster (Cluster.Kubectl); an error fails t.
func kubectl(ctx context.Context, t *testing.T, c *Cluster, args ...string) string {
	t.Helper()
	out, err := c.Kubectl(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// kproxyCleanup runs section 7's command on node n: `kproxy --cleanup`
// from kproxy's image through the node's containerd (RKE2's ctr and
// socket there; this cluster's ctr and the node's socket here), in the
// node's network namespace (--net-host: the namespace containerd runs in).
func kproxyCleanup(ctx context.Context, t *testing.T, c *Cluster, n *Node) {
	t.Helper()
	ctr, err := ctrBinary(c.Config.BinDir)
	if err != nil {
		t.Fatal(err)
	}
	image := strings.TrimSpace(kproxyImage(ctx, c, "localhost/kproxy:v0.1.0-dev"))
	out, err := framework.RunUntil(ctx, ctr, "--address", n.Socket, "-n", "k8s.io", "run", "--rm", "--net-host", "--privileged",
		"--mount", "type=bind,src=/lib/modules,dst=/lib/modules,options=rbind:ro",
		"--mount", "type=bind,src=/run/xtables.lock,dst=/run/xtables.lock,options=bind:rw",
		image, "kproxy-cleanup", "kproxy", "--cleanup", "--v=2")
	if err != nil {
		t.Fatalf("node %s: kproxy --cleanup: %v", n.Name, err)
	}
	t.Logf("node %s: kproxy --cleanup:\n%s", n.Name, TailLines(out, 10))
}

// kproxyImage is the image of kproxy's DaemonSet, or def when there is none.
func kproxyImage(ctx context.Context, c *Cluster, def string) string {
	out, err := c.Kubectl(ctx, "-n", kproxyNS, "get", "daemonset", "kproxy", "-o", "jsonpath={.spec.template.spec.containers[0].image}")
	if err != nil || strings.TrimSpace(out) == "" {
		return def
	}
	return out
}

// checkNoProxyRules fails t if node n holds any Service proxy rule: an
// nftables table of kproxy or kube-proxy (kube-proxy, kube-proxy-sN), or
// kube-proxy's chains in either iptables backend.
func checkNoProxyRules(ctx context.Context, t *testing.T, n *Node) {
	t.Helper()
	out, err := framework.RunIn(ctx, n.Namespace, "nft", "list", "tables")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "kube-proxy") {
		t.Errorf("node %s keeps nftables tables of the proxy:\n%s", n.Name, out)
	}
	if err := noKubeProxyChains(ctx, n); err != nil {
		t.Errorf("node %s: %v", n.Name, err)
	}
}

// upgradeArchive writes to dst a copy of kproxy's OCI image archive src
// that is another image: its config carries the version label version (a
// new config, so a new image ID, as a new release would have), and its
// index names it name (nameIndex). It needs umoci.
func upgradeArchive(ctx context.Context, src, name, version, dst string) error {
	layout, err := os.MkdirTemp("", "kproxy-upgrade-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(layout)
	if _, err := framework.RunUntil(ctx, "tar", "-xf", src, "-C", layout); err != nil {
		return err
	}
	if err := nameIndex(filepath.Join(layout, "index.json"), "base"); err != nil {
		return err
	}
	for _, s := range [][]string{
		{"umoci", "config", "--image", layout + ":base", "--tag", "upgrade",
			"--config.label", "org.opencontainers.image.version=" + version,
			"--config.label", "org.opencontainers.image.ref.name=" + name},
		{"umoci", "rm", "--image", layout + ":base"},
		{"umoci", "gc", "--layout", layout},
	} {
		if _, err := framework.RunUntil(ctx, s[0], s[1:]...); err != nil {
			return err
		}
	}
	if err := nameIndex(filepath.Join(layout, "index.json"), name); err != nil {
		return err
	}
	_, err = framework.RunUntil(ctx, "tar", "-cf", dst, "-C", layout, ".")
	return err
}
