package cluster

import (
	"bytes"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
)

func write(t *testing.T, c *Cluster) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := c.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// Same options, same bytes, also after the same changes; another seed,
// another cluster.
func TestDeterministic(t *testing.T) {
	gen := func(seed uint64) []byte {
		c, err := Generate(Options{Services: 2000, Mix: Realistic, Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		c.FlipReady()
		c.Reschedule()
		c.AddService()
		c.RemoveService()
		for range c.Rollout() {
		}
		c.Burst(100)
		return write(t, c)
	}
	a, b := gen(1), gen(1)
	if !bytes.Equal(a, b) {
		t.Fatal("two clusters of the same seed differ")
	}
	if bytes.Equal(a, gen(2)) {
		t.Fatal("clusters of seeds 1 and 2 are the same")
	}
}

// The realistic mix at 10k has the shares docs/benchmarks.md states, within
// a tolerance that a seed cannot miss by chance (±1.5 points at 10k).
func TestRealisticStatistics(t *testing.T) {
	const n = 10000
	c, err := Generate(Options{Services: n, Mix: Realistic, Seed: 42})
	if err != nil {
		t.Fatal(err)
	}
	count := map[Kind]int{}
	dual, multi, tail, nodePorts := 0, 0, 0, map[int32]bool{}
	for i, s := range c.Services {
		count[c.Kinds[i]]++
		if len(s.Spec.IPFamilies) == 2 {
			dual++
		}
		if len(s.Spec.Ports) > 1 {
			multi++
		}
		eps := 0
		for _, si := range c.SlicesOf[i] {
			if c.Slices[si].AddressType == "IPv4" {
				eps += len(c.Slices[si].Endpoints)
			}
		}
		if eps >= 500 {
			tail++
		}
		for _, p := range s.Spec.Ports {
			if p.NodePort != 0 {
				if nodePorts[p.NodePort] {
					t.Errorf("node port %d given twice", p.NodePort)
				}
				nodePorts[p.NodePort] = true
			}
		}
	}
	pct := func(k int) float64 { return 100 * float64(k) / n }
	for _, w := range []struct {
		what string
		got  float64
		want float64
	}{
		{"plain ClusterIP", pct(count[KindClusterIP]), 60},
		{"NodePort", pct(count[KindNodePort]), 15},
		{"LoadBalancer", pct(count[KindLB] + count[KindLBRanges]), 10},
		{"LoadBalancer with source ranges", pct(count[KindLBRanges]), 5},
		{"ClientIP affinity", pct(count[KindAffinity]), 5},
		{"externalTrafficPolicy Local", pct(count[KindETPLocal]), 5},
		{"internalTrafficPolicy Local", pct(count[KindITPLocal]), 5},
		{"dual-stack", pct(dual), 5},
		{"multi-port", pct(multi), 10},
	} {
		if w.got < w.want-1.5 || w.got > w.want+1.5 {
			t.Errorf("%s: %.1f %% of the services, want %v %% ± 1.5", w.what, w.got, w.want)
		}
	}
	// Endpoints per service, IPv6 copies of dual-stack services aside.
	v4 := 0
	for _, s := range c.Slices {
		if s.AddressType == "IPv4" {
			v4 += len(s.Endpoints)
		}
	}
	if mean := float64(v4) / n; mean < 8 || mean > 13 {
		t.Errorf("mean endpoints per service %.1f, want about 10 (8..13)", mean)
	}
	if tail < 5 || tail > 20 {
		t.Errorf("%d services with 500+ endpoints, want a few (5..20) at 10k", tail)
	}
	zones := map[string]bool{}
	for _, nd := range c.Nodes {
		zones[nd.Labels[v1.LabelTopologyZone]] = true
	}
	if len(c.Nodes) < 100 || len(zones) < 3 {
		t.Errorf("%d nodes in %d zones, want many nodes in 3 or more zones", len(c.Nodes), len(zones))
	}
	for _, s := range c.Slices {
		if len(s.Endpoints) > 100 {
			t.Errorf("slice %s holds %d endpoints, more than the controller's 100", s.Name, len(s.Endpoints))
		}
	}
	t.Logf("%d services, %d endpoints (%d IPv4), %d slices, %d nodes, %d node ports", n, c.Endpoints(), v4, len(c.Slices), len(c.Nodes), len(nodePorts))
}

// Every endpoint address and port is distinct across the whole cluster,
// also where the pod addresses wrap around (at 10k realistic they do).
func TestEndpointsDistinct(t *testing.T) {
	c, err := Generate(Options{Services: 10000, Mix: Realistic, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, si := range c.SlicesOf {
		for _, i := range si {
			s := c.Slices[i]
			for _, e := range s.Endpoints {
				key := fmt.Sprintf("%s:%d", e.Addresses[0], *s.Ports[0].Port)
				if other, ok := seen[key]; ok {
					t.Fatalf("endpoint %s:%d in %s and %s", e.Addresses[0], *s.Ports[0].Port, s.Name, other)
				}
				seen[key] = s.Name
			}
		}
	}
}

func TestPlain(t *testing.T) {
	c, err := Generate(Options{Services: 100, Mix: Plain, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Endpoints(); got != 1000 {
		t.Errorf("%d endpoints, want 100 × 10", got)
	}
	for i, s := range c.Services {
		if s.Spec.Type != v1.ServiceTypeClusterIP || len(s.Spec.Ports) != 1 || len(s.Spec.IPFamilies) != 1 {
			t.Errorf("service %d is not a plain ClusterIP service: %+v", i, s.Spec)
		}
	}
	if len(c.Probes()) != 3 {
		t.Errorf("probes %v, want 3", c.Probes())
	}
}

func TestBadOptions(t *testing.T) {
	for _, o := range []Options{{Services: 0}, {Services: 100000}, {Services: 10, Mix: "odd"}, {Services: 10, Nodes: 1}} {
		if _, err := Generate(o); err == nil {
			t.Errorf("Generate(%+v) gave no error", o)
		}
	}
}

// Each step of a rollout is a change of its own: the cluster written
// after each differs from the one before.
func TestRolloutSteps(t *testing.T) {
	c, err := Generate(Options{Services: 200, Mix: Realistic, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	prev, steps := write(t, c), 0
	for ch := range c.Rollout() {
		cur := write(t, c)
		if bytes.Equal(prev, cur) {
			t.Errorf("%s changed nothing", ch.Name)
		}
		prev = cur
		steps++
	}
	if steps < 3 {
		t.Errorf("%d rollout steps, want about 4", steps)
	}
}
