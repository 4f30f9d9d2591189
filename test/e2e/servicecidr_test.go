package e2e

// The service-cidrs scenario: the API server creates the default
// ServiceCIDR ("kubernetes") from --service-cluster-ip-range (serviceCIDRs
// in env_test.go), kproxy watches it as system:kube-proxy, and nftables
// mode drops traffic to addresses in it that no Service holds, as
// upstream's cluster-ips-check chain does. Addresses: see env_test.go;
// 198.19.127.255, the last address of 198.19.0.0/17, is never allocated
// (the allocator leaves out the broadcast address).

import (
	"fmt"
	"net/netip"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kproxy/kproxy/internal/testutil/netns"
)

var unallocatedIP = netip.MustParseAddr("198.19.127.255")

func scenarioServiceCIDRs(e *env) {
	t := e.t
	if e.mode.proxyMode != "nftables" {
		t.Logf("service-cidrs: %s mode does not drop unallocated cluster IPs (neither does upstream's); nothing to check", e.mode.name)
		return
	}

	// kproxy's user may list ServiceCIDRs (upstream's system:node-proxier
	// role, bound to system:kube-proxy; impersonated here, as kproxy's
	// kubeconfig reaches the API server from node-a's namespace only), and
	// the API server made the default one from its flags.
	cfg := rest.CopyConfig(e.cp.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:kube-proxy"}
	proxyClient, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var cidrs []string
	e.eventually("the default ServiceCIDR exists and system:kube-proxy can list it", func() error {
		list, err := proxyClient.NetworkingV1().ServiceCIDRs().List(e.ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		cidrs = nil
		for _, sc := range list.Items {
			cidrs = append(cidrs, sc.Spec.CIDRs...)
		}
		if len(cidrs) == 0 {
			return fmt.Errorf("no ServiceCIDR yet")
		}
		return nil
	})
	want := serviceCIDRs[0].String()
	found := false
	for _, c := range cidrs {
		found = found || c == want
	}
	if !found {
		t.Fatalf("ServiceCIDRs hold %v, not --service-cluster-ip-range's %s", cidrs, want)
	}

	// The live ruleset drops what is left of the range.
	e.eventually("cluster-ips-check drops "+want, func() error {
		out, err := nft(e.node.Name, "list", "chain", "ip", "kube-proxy", "cluster-ips-check")
		if err != nil {
			return err
		}
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, want) && strings.Contains(line, "drop") {
				return nil
			}
		}
		return fmt.Errorf("no drop of %s in:\n%s", want, out)
	})

	svc := e.createService("web")
	cip := clusterIP(svc, v4)
	e.setEndpoints("web", ipv4, endpoint{pod: podA1})
	e.expectServers(testerA, "tcp", ap(cip, 80), podA1)
	e.expectOutcome(testerA, "tcp", ap(unallocatedIP, 80), netns.Timeout)
	// An allocated address's undefined port is still rejected, not dropped.
	e.expectOutcome(testerA, "tcp", ap(cip, 81), netns.Refused)
	e.expectServers(testerA, "tcp", ap(cip, 80), podA1)
}
