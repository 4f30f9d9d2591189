package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/internal/proxy/nftables"
)

// writeSnapshot writes n services × 10 endpoints, plus node-a, as a kubectl
// List in JSON (the file source reads what kubectl writes).
func writeSnapshot(b *testing.B, path string, n int) {
	b.Helper()
	items := []any{&v1.Node{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
		Status:     v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "198.17.0.10"}}},
	}}
	for i := range n {
		name := "svc-" + strconv.Itoa(i)
		items = append(items, &v1.Service{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
			ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name},
			Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: addr([2]byte{198, 19}, i).String(),
				Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}},
		})
		var eps []discovery.Endpoint
		for j := range endpointsPerService {
			k := i*endpointsPerService + j
			eps = append(eps, discovery.Endpoint{Addresses: []string{addr([2]byte{198, 18}, k%65536).String()},
				NodeName: ptr.To("node-b"), Conditions: discovery.EndpointConditions{Ready: ptr.To(true)}})
		}
		items = append(items, &discovery.EndpointSlice{
			TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
			ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name + "-1",
				Labels: map[string]string{discovery.LabelServiceName: name}},
			AddressType: discovery.AddressTypeIPv4,
			Endpoints:   eps,
			Ports:       []discovery.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
		})
	}
	data, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		b.Fatal(err)
	}
}

// buildKproxy builds the binary once per benchmark run.
func buildKproxy(b *testing.B) string {
	b.Helper()
	out := filepath.Join(b.TempDir(), "kproxy")
	root, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-o", out, "./cmd/kproxy")
	cmd.Dir = filepath.Dir(strings.TrimSpace(string(root)))
	if o, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, o)
	}
	return out
}

// procStatus reads a field (kB) of /proc/PID/status.
func procStatus(pid int, field string) int {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), field+":"); ok {
			v, _ := strconv.Atoi(strings.Fields(rest)[0])
			return v
		}
	}
	return -1
}

// BenchmarkKproxyProcess runs the kproxy binary in a namespace with the
// file source at N services × 10 endpoints and reports the time from
// start to the first sync's rules being in place, and the process's peak
// and settled RSS: 2 s after the first sync, and again after two periodic
// syncs (sync period 10 s), which is what a node runs on. Periodic syncs
// are partial: full syncs are hourly, as upstream's.
func BenchmarkKproxyProcess(b *testing.B) {
	needRoot(b)
	bin := buildKproxy(b)
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			snap := filepath.Join(b.TempDir(), "snapshot.json")
			writeSnapshot(b, snap, n)
			last := addr([2]byte{198, 19}, n-1).String() + " . tcp . 80"
			// The last service's dispatch is in its shard table.
			lastTable := nftables.ShardTable(nftables.DefaultTableName, nftables.ShardOf(spn(n-1), nftablesShards(n)))
			for range b.N {
				ns := newNetns(b)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, bin, "--proxy-mode", "nftables",
					"--hostname-override", "node-a", "--from-file", snap, "--cluster-cidr", "198.18.0.0/16",
					"--healthz-bind-address", "", "--metrics-bind-address", "", "--iptables-sync-period", "10s",
					"--conntrack-max-per-core", "0") // nf_conntrack_max is read-only in a netns
				cmd.Env = append(os.Environ(), "GOMAXPROCS=2")
				start := time.Now()
				if err := cmd.Start(); err != nil {
					b.Fatal(err)
				}
				synced := time.Duration(0)
				for time.Since(start) < 4*time.Minute {
					// A plain ClusterIP port is dispatched from cluster-services.
					out, _ := exec.Command("ip", "netns", "exec", ns, "nft", "get", "element", "ip", lastTable, "cluster-services", "{", last, "}").CombinedOutput()
					if strings.Contains(string(out), "goto") {
						synced = time.Since(start)
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
				if synced == 0 {
					b.Fatal("rules never appeared")
				}
				time.Sleep(2 * time.Second) // let the heap settle after the first sync
				pid := cmd.Process.Pid
				// ip netns exec execs kproxy in place: same pid.
				b.ReportMetric(synced.Seconds(), "s-to-first-sync")
				b.ReportMetric(float64(procStatus(pid, "VmHWM"))/1024, "MiB-peak-rss")
				b.ReportMetric(float64(procStatus(pid, "VmRSS"))/1024, "MiB-rss")
				time.Sleep(23 * time.Second) // two periodic syncs
				b.ReportMetric(float64(procStatus(pid, "VmRSS"))/1024, "MiB-rss-periodic")
				_ = cmd.Process.Signal(os.Interrupt)
				_ = cmd.Wait()
				cancel()
			}
		})
	}
}

// nftablesShards is the shard count kproxy picks for n service ports at a
// start (powers of two of DefaultServicesPerShard).
func nftablesShards(n int) int {
	k := 1
	for k*nftables.DefaultServicesPerShard < n {
		k *= 2
	}
	return k
}
