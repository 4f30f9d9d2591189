package kernel

// A broken snapshot file must never empty the node:
// kproxy reads its snapshot directory (--from-file DIR) on node-a; the
// snapshot is deleted, truncated, replaced by garbage, by 60 % of itself,
// by a directory and by a FIFO, in turn. Through each fault the services
// keep carrying traffic from the outside client, /healthz turns 503 and
// says the source is stale once the fault has lasted the health timeout
// (2 × the sync period, 2 s here), and the good file written back makes it
// 200 again. Two long-lived connections opened at the start echo after
// every fault. A valid change after all of it is applied.

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// TestSnapshotFileFaults runs in nftables mode and in iptables mode with
// each backend; not in the compact iptables layout, which reads the file
// the same way and programs the same chains for a stable snapshot.
func TestSnapshotFileFaults(t *testing.T) {
	t.Parallel()
	for _, m := range []proxyMode{nftablesMode, iptablesMode(xtables.Legacy), iptablesMode(xtables.NFT)} {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			for _, bin := range m.needs {
				netns.Require(t, bin)
			}
			testSnapshotFileFaults(t, m)
		})
	}
}

func testSnapshotFileFaults(t *testing.T, m proxyMode) {
	// The health timeout is 2 × the sync period: 4 s.
	const syncPeriod = 2 * time.Second
	snap := exampleSnapshot(t)
	c := newCluster(t, clusterOptions{mode: m, snapshot: snap, kproxyOn: []string{nodeA}, fromDir: true,
		args: []string{"--iptables-sync-period", syncPeriod.String()}})
	node := c.Nodes[nodeA]
	healthz := "http://" + netip.AddrPortFrom(node.Addr(clientIP), 10256).String() + "/healthz"
	good := snap.yaml(t)

	webPods := []string{webA, webB}
	// carries checks that the services answer from outside the node, by
	// ClusterIP (the client routes service IPs to node-a) and NodePort.
	carries := func(phase string) {
		t.Helper()
		for _, dst := range []netip.AddrPort{ap("198.19.0.10:80"), netip.AddrPortFrom(node.Addr(clientIP), 30080)} {
			r := c.Client.Request("tcp", dst, netns.DialOptions{})
			if r.Outcome != netns.Answered || !slices.Contains(webPods, r.Server) {
				t.Errorf("%s: tcp %s from the client: %v; want an answer from %v", phase, dst, r, webPods)
			}
		}
	}
	// health waits (bounded) for /healthz to answer code, with a body
	// that contains every fragment.
	health := func(phase string, code int, fragments ...string) {
		t.Helper()
		netns.Eventually(t, 4*syncPeriod+syncTimeout, fmt.Sprintf("%s: /healthz %d", phase, code), func() (bool, string) {
			got, body, err := node.HTTPGet(healthz, 2*time.Second)
			if err != nil || got != code {
				return false, fmt.Sprintf("%d %s (%v)", got, body, err)
			}
			for _, f := range fragments {
				if !strings.Contains(body, f) {
					return false, "body " + body + " lacks " + f
				}
			}
			return true, ""
		})
	}
	health("start", 200)
	carries("start")
	// Long-lived connections opened before the faults must live through
	// all of them.
	streams := map[string]*netns.Session{
		webA: openSessionTo(t, c.Client, ap("198.19.0.10:80"), webA),
		webB: openSessionTo(t, c.Pod(t, testerA).NS, ap("198.19.0.10:80"), webB),
	}
	streamsLive := func(phase string) {
		t.Helper()
		for pod, s := range streams {
			checkSession(t, phase+": the connection to "+pod, s, pod)
		}
	}

	dir := filepath.Dir(c.snapPath)
	writeRaw := func(data []byte) {
		t.Helper()
		if err := os.WriteFile(c.snapPath, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// clear removes whatever is at the snapshot's name.
	clear := func() {
		t.Helper()
		if err := os.RemoveAll(c.snapPath); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []struct {
		name, reason string
		breakIt      func()
	}{
		{"the only file deleted", "no_files", clear},
		{"truncated to 0 bytes", "empty", func() { writeRaw(nil) }},
		{"garbage", "unparsable", func() { writeRaw([]byte("\x00\x01 garbage ]]] {{{\n")) }},
		{"60 % of the YAML", "truncated", func() { writeRaw(good[:len(good)*6/10]) }},
		{"a directory in the file's place", "not_regular", func() {
			clear()
			if err := os.Mkdir(c.snapPath, 0o755); err != nil {
				t.Fatal(err)
			}
		}},
		{"a FIFO in the file's place", "not_regular", func() {
			clear()
			if err := syscall.Mkfifo(c.snapPath, 0o644); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		f.breakIt()
		// Long enough for kproxy to have read the broken file.
		time.Sleep(time.Second)
		carries(f.name)
		health(f.name+", past the health timeout", 503, `"stale":true`, f.reason)
		carries(f.name + ", past the health timeout")
		clear()
		c.apply(snap)
		health(f.name+", repaired", 200)
		carries(f.name + ", repaired")
		streamsLive(f.name)
		if t.Failed() {
			t.Logf("snapshot directory %s; kproxy log:\n%s", dir, c.kproxy[nodeA].Tail(netns.LogTailLines))
			return
		}
	}

	// Every fault was counted under its reason.
	_, body, err := node.HTTPGet("http://127.0.0.1:10249/metrics", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"no_files", "empty", "unparsable", "truncated", "not_regular"} {
		if !metricPositive(body, `kproxy_source_file_errors_total{reason="`+r+`"}`) {
			t.Errorf("kproxy_source_file_errors_total{reason=%q} not counted", r)
		}
	}

	// A valid change after the faults applies.
	snap.editService(t, "web-clusterip", func(s *v1.Service) { s.Spec.Ports[0].Port = 81 })
	c.apply(snap)
	netns.Eventually(t, syncTimeout, "web-clusterip on its new port 81", func() (bool, string) {
		r := c.Client.Request("tcp", ap("198.19.0.10:81"), netns.DialOptions{})
		return r.Outcome == netns.Answered, r.String()
	})
	health("after the change", 200)
	streamsLive("after the change")
}
