package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/nftables"
	"github.com/kproxy/kproxy/test/e2e/framework"
)

// BenchmarkAPIServerScale runs kproxy in nftables mode against a real
// kube-apiserver holding N ClusterIP Services × 10 endpoints (one
// EndpointSlice each, endpoints on another node), the shape upstream
// kube-proxy is measured on beside it, and reports the time from
// kproxy's start until its first sync has programmed every service, and the
// process's RSS once settled (5 s later) and at its peak. Run as root with
// KPROXY_E2E=1:
//
//	go test ./test/e2e -run '^$' -bench APIServerScale -benchtime 1x -timeout 30m
func BenchmarkAPIServerScale(b *testing.B) {
	if kproxyBinary == "" {
		b.Skip(framework.SkipReason())
	}
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			cp := sharedControlPlane(b)
			cp.CreateNode(b, nodeA, nodeAIP)
			const kns = "scale"
			created := time.Now()
			createScaleObjects(b, cp, kns, n)
			b.Logf("created %d services and %d endpoint slices in %s", n, n, time.Since(created).Round(time.Second))

			// The last service's dispatch element is in its shard table: its
			// presence means the first sync programmed every service. The
			// services are plain ClusterIP ports: their elements are in
			// cluster-services.
			last := model.ServicePortName{NamespacedName: types.NamespacedName{Namespace: kns, Name: scaleName(n - 1)}, Port: "http", Protocol: corev1.ProtocolTCP}
			table := nftables.ShardTable(nftables.DefaultTableName, nftables.ShardOf(last, scaleShards(n)))
			elem := scaleClusterIP(n-1).String() + " . tcp . 80"
			for range b.N {
				ns := framework.AddNamespace(b, "kpscale")
				cp.ConnectNamespace(b, ns)
				argv := []string{kproxyBinary, "--kubeconfig", cp.Kubeconfig(b, "system:kube-proxy"),
					"--hostname-override", nodeA, "--proxy-mode", "nftables", "--cluster-cidr", clusterCIDR,
					"--conntrack-max-per-core", "0"} // nf_conntrack_max is read-only in a netns
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				start := time.Now()
				p := framework.StartProcess(b, ns, b.TempDir(), "kproxy", argv...)
				synced := time.Duration(0)
				for ctx.Err() == nil {
					// A plain ClusterIP port is dispatched from cluster-services.
					out, _ := framework.RunIn(ctx, ns, "nft", "get", "element", "ip", table, "cluster-services", "{", elem, "}")
					if strings.Contains(out, "goto") {
						synced = time.Since(start)
						break
					}
					select {
					case <-p.Done():
						b.Fatalf("kproxy exited: %v\n%s", p.ExitError(), p.Tail(30))
					case <-time.After(50 * time.Millisecond):
					}
				}
				if synced == 0 {
					b.Fatalf("the last service (%s in table %s) was not programmed within 5 minutes\n%s", elem, table, p.Tail(30))
				}
				time.Sleep(5 * time.Second)
				b.ReportMetric(synced.Seconds(), "s-to-first-sync")
				b.ReportMetric(procStatusMiB(b, p.Pid(), "VmRSS"), "MiB-rss")
				b.ReportMetric(procStatusMiB(b, p.Pid(), "VmHWM"), "MiB-peak-rss")
				if err := p.Stop(); err != nil {
					b.Error(err)
				}
				cancel()
			}
		})
	}
}

func scaleName(i int) string { return "svc-" + strconv.Itoa(i) }

// scaleClusterIP is service i's ClusterIP, inside the first service CIDR
// (198.19.0.0/17 holds 32k addresses), after 198.19.0.1, the kubernetes
// Service's.
func scaleClusterIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{198, 19, byte((i + 2) >> 8), byte(i + 2)})
}

// scaleShards is the shard count kproxy picks for n service ports at a start.
func scaleShards(n int) int {
	k := 1
	for k*nftables.DefaultServicesPerShard < n {
		k *= 2
	}
	return k
}

// createScaleObjects creates n Services and their EndpointSlices in
// namespace kns, with a client allowed to go as fast as the API server.
func createScaleObjects(b *testing.B, cp *framework.ControlPlane, kns string, n int) {
	b.Helper()
	cfg := *cp.Config
	cfg.QPS, cfg.Burst = 5000, 5000
	client, err := kubernetes.NewForConfig(&cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kns}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	const workers = 16
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				if err := createScaleService(ctx, client, kns, i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

func createScaleService(ctx context.Context, client kubernetes.Interface, kns string, i int) error {
	name := scaleName(i)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: kns, Name: name, Labels: map[string]string{"app": name}},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: scaleClusterIP(i).String(),
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}, Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	if _, err := client.CoreV1().Services(kns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating service %s: %w", name, err)
	}
	// Endpoint j of service i is 198.18.(k>>8).(k) with k = i*10+j modulo
	// 65536, as in test/bench: beyond 65k addresses the services use port
	// 8081, so that every address and port stays distinct.
	port := int32(8080 + (i*10+9)/65536)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: kns, Name: name + "-1", Labels: map[string]string{
			discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "e2e.kproxy.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(port), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for j := range 10 {
		k := (i*10 + j) % 65536
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{netip.AddrFrom4([4]byte{198, 18, byte(k >> 8), byte(k)}).String()},
			NodeName:   ptr.To(nodeB),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
		})
	}
	if _, err := client.DiscoveryV1().EndpointSlices(kns).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating endpoint slice of %s: %w", name, err)
	}
	return nil
}

func procStatusMiB(b *testing.B, pid int, field string) float64 {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
			if err != nil {
				b.Fatal(err)
			}
			return float64(kb) / 1024
		}
	}
	b.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}
