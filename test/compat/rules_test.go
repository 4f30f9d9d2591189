package compat

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/test/e2e/framework"
)

// rulesNS holds the Services whose iptables rules are compared: endpoint
// addresses in the pod CIDRs of the configurations (198.18.128.0/17,
// fd00:18:128::/64), cluster IPs allocated from 198.19.0.0/16 and
// fd00:19::/112.
const rulesNS = "compat-rules"

// createRuleServices creates the Services and EndpointSlices both proxies
// program in iptables mode (there is no controller manager: the slices are
// written as the EndpointSlice controller would):
//   - order: three endpoints whose text order differs from their address
//     order (198.18.129.9, .10, .11), so the dispatch probabilities show
//     which order each proxy uses;
//   - nodeport: a dual-stack NodePort with one endpoint per family.
func createRuleServices(t *testing.T, cp *framework.ControlPlane) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := cp.Client
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: rulesNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating namespace %s: %v", rulesNS, err)
	}
	port := []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}}
	services := []*corev1.Service{
		{ObjectMeta: metav1.ObjectMeta{Name: "order"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Ports: port}},
		{ObjectMeta: metav1.ObjectMeta{Name: "nodeport"}, Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeNodePort, Ports: port, IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyRequireDualStack),
		}},
	}
	for _, s := range services {
		if _, err := c.CoreV1().Services(rulesNS).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating service %s: %v", s.Name, err)
		}
	}
	slice := func(name, svc string, typ discoveryv1.AddressType, ips ...string) *discoveryv1.EndpointSlice {
		s := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
			AddressType: typ,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
		}
		for _, ip := range ips {
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
		}
		return s
	}
	for _, s := range []*discoveryv1.EndpointSlice{
		slice("order-1", "order", discoveryv1.AddressTypeIPv4, "198.18.129.9", "198.18.129.10", "198.18.129.11"),
		slice("nodeport-4", "nodeport", discoveryv1.AddressTypeIPv4, "198.18.129.20"),
		slice("nodeport-6", "nodeport", discoveryv1.AddressTypeIPv6, "fd00:18:128::20"),
	} {
		if _, err := c.DiscoveryV1().EndpointSlices(rulesNS).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating EndpointSlice %s: %v", s.Name, err)
		}
	}
}

// rulesConfig is the configuration whose rules are compared: the first,
// so both nodes start without rules.
const rulesConfig = "kubeadm-iptables"

// saveTools are the save binaries read on each node: both backends, so
// that the comparison holds whichever backend each proxy chose (upstream
// runs the host's `iptables`, kproxy detects).
var saveTools = map[string][]string{
	"IPv4": {"iptables-legacy-save", "iptables-nft-save"},
	"IPv6": {"ip6tables-legacy-save", "ip6tables-nft-save"},
}

// savedChains reads every table of both families and backends in ns:
// "IPv4 nat KUBE-SERVICES" -> the chain's policy line and its rules, in
// order, as iptables-save prints them without counters.
func savedChains(t *testing.T, ns string) map[string]string {
	out := map[string]string{}
	for fam, tools := range saveTools {
		for _, tool := range tools {
			text, err := framework.RunIn(context.Background(), ns, tool)
			if err != nil {
				t.Fatalf("%s in %s: %v\n%s", tool, ns, err, text)
			}
			table := ""
			for _, l := range strings.Split(text, "\n") {
				switch {
				case strings.HasPrefix(l, "*"):
					table = l[1:]
				case strings.HasPrefix(l, ":"):
					name, policy, _ := strings.Cut(l[1:], " ")
					policy, _, _ = strings.Cut(policy, " ")
					key := fam + " " + table + " " + name
					if _, ok := out[key]; !ok {
						out[key] = "policy " + policy
					}
				case strings.HasPrefix(l, "-A "):
					chain, _, _ := strings.Cut(l[3:], " ")
					key := fam + " " + table + " " + chain
					out[key] += "\n" + l
				}
			}
		}
	}
	return out
}

// bothFamiliesSynced reads ns's chains once each family's first sync has
// written KUBE-POSTROUTING (every sync writes its rules): a proxy reports
// its first sync when one family is done, and upstream's IPv6 proxier may
// still be on its way then. Bounded: 30 s, then the last reading is
// compared as it is.
func bothFamiliesSynced(t *testing.T, ns string) map[string]string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		chains := savedChains(t, ns)
		synced := true
		for _, fam := range []string{"IPv4", "IPv6"} {
			if !strings.Contains(chains[fam+" nat KUBE-POSTROUTING"], "\n-A ") {
				synced = false
			}
		}
		if synced || time.Now().After(deadline) {
			return chains
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// compareRules compares what both proxies left in the kernel after their
// first sync in iptables mode, chain by chain. Built-in chains that
// neither proxy wrote to (policy only) are left out.
func compareRules(t *testing.T, nodes [2]node) {
	var chains [2]map[string]string
	for i, n := range nodes {
		chains[i] = bothFamiliesSynced(t, n.ns)
	}
	keys := unionKeys(chains[0], chains[1])
	sort.Strings(keys)
	for _, k := range keys {
		up, kp := orAbsent(chains[0], k), orAbsent(chains[1], k)
		if !strings.Contains(k, " KUBE-") && !strings.Contains(up, "\n") && !strings.Contains(kp, "\n") {
			continue
		}
		if sharedChains[k[strings.Index(k, " ")+1:]] {
			up, kp = serviceOrderFree(up), serviceOrderFree(kp)
		}
		t.Run(k, func(t *testing.T) {
			compare(t, kindRules, k, k, ruleText(up), ruleText(kp))
		})
	}
	sectionDone(kindRules)
}

// sharedChains hold one or more rules per service port, which upstream
// writes in the order it ranges over its map of service ports (random);
// kproxy writes them sorted by name. Their rules are compared as a set.
var sharedChains = map[string]bool{
	"nat KUBE-SERVICES": true, "nat KUBE-NODEPORTS": true,
	"filter KUBE-SERVICES": true, "filter KUBE-EXTERNAL-SERVICES": true,
	"filter KUBE-NODEPORTS": true, "filter KUBE-PROXY-FIREWALL": true,
}

// serviceOrderFree sorts a shared chain's rules, but for the node port
// jump that must stay the last rule of KUBE-SERVICES (where it is).
func serviceOrderFree(s string) string {
	if s == "absent" {
		return s
	}
	lines := strings.Split(s, "\n")
	rules := lines[1:]
	if n := len(rules); n > 0 && strings.Contains(rules[n-1], "NOTE: this must be the last rule") {
		rules = rules[:n-1]
	}
	sort.Strings(rules)
	return strings.Join(lines, "\n")
}

// ruleText is a chain's text on one line for the report.
func ruleText(s string) string {
	if s == "absent" {
		return s
	}
	lines := strings.Split(s, "\n")
	return fmt.Sprintf("%s, %d rules: %s", lines[0], len(lines)-1, strings.Join(lines[1:], " ; "))
}
