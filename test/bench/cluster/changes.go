package cluster

import (
	"fmt"
	"iter"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

// Change is what one step of a scenario did to the cluster: objects to
// create, to update and to delete (in that order), as a controller would
// write them to the API server. The cluster itself already holds the
// result (WriteJSON writes it).
type Change struct {
	Name   string
	Create []any // *v1.Service, *discovery.EndpointSlice
	Update []any
	Delete []any
	// Endpoints is how many endpoints the change touched.
	Endpoints int
}

// The typical changes of a running cluster, one at a time. Each draws
// from the cluster's generator, so a sequence of changes is as
// deterministic as the cluster.

// FlipReady turns one endpoint of a random service ready or not ready.
func (c *Cluster) FlipReady() Change {
	i := c.randomService(func(int) bool { return true })
	s := c.Slices[c.SlicesOf[i][0]]
	e := &s.Endpoints[c.rng.IntN(len(s.Endpoints))]
	ready := !ptr.Deref(e.Conditions.Ready, true)
	e.Conditions.Ready, e.Conditions.Serving = ptr.To(ready), ptr.To(ready)
	return Change{Name: fmt.Sprintf("endpoint of %s ready=%v", c.Services[i].Name, ready), Update: []any{s}, Endpoints: 1}
}

// Reschedule moves one pod of a random service to another node: its
// endpoint gets a new address.
func (c *Cluster) Reschedule() Change {
	i := c.randomService(func(int) bool { return true })
	s := c.Slices[c.SlicesOf[i][0]]
	j := c.rng.IntN(len(s.Endpoints))
	hostname := s.Endpoints[j].Hostname
	e := c.endpoint(v1.IPFamily(s.AddressType))
	e.Hostname = hostname // keeps its slice's port round
	e.Conditions.Ready, e.Conditions.Serving = ptr.To(true), ptr.To(true)
	s.Endpoints[j] = e
	return Change{Name: "pod of " + c.Services[i].Name + " rescheduled", Update: []any{s}, Endpoints: 2}
}

// AddService adds a service of the mix with its endpoints.
func (c *Cluster) AddService() Change {
	if c.nextSvc >= maxServices {
		return Change{Name: "no room for another service"}
	}
	i := c.nextSvc
	c.nextSvc++
	c.addService(i, false)
	ch := Change{Name: "service " + c.Services[i].Name + " added", Create: []any{c.Services[i]}}
	for _, s := range c.SlicesOf[i] {
		ch.Create = append(ch.Create, c.Slices[s])
		ch.Endpoints += len(c.Slices[s].Endpoints)
	}
	return ch
}

// RemoveService removes a random service (never one of the first, middle
// or last plain ClusterIP services Probes picks) and its slices.
func (c *Cluster) RemoveService() Change {
	probes := map[int]bool{}
	for _, p := range c.Probes() {
		probes[p] = true
	}
	i := c.randomService(func(i int) bool { return !probes[i] })
	ch := Change{Name: "service " + c.Services[i].Name + " removed"}
	for _, s := range c.SlicesOf[i] {
		ch.Delete = append(ch.Delete, c.Slices[s])
		ch.Endpoints += len(c.Slices[s].Endpoints)
	}
	ch.Delete = append(ch.Delete, c.Services[i])
	c.Services[i], c.SlicesOf[i] = nil, nil
	return ch
}

// Rollout is a deployment of 50 pods rolling (maxSurge 25 %): the service
// with the endpoint count nearest 50 (IPv4, not a probe) gets 13 new
// ready pods and loses 13 old ones per step until every pod is new. Each
// step is one Change, made when the sequence reaches it (write the
// cluster out before asking for the next).
func (c *Cluster) Rollout() iter.Seq[Change] {
	probes := map[int]bool{}
	for _, p := range c.Probes() {
		probes[p] = true
	}
	best, bestDiff := -1, 1<<30
	for i, ss := range c.SlicesOf {
		if c.Services[i] == nil || probes[i] || len(ss) != 1 {
			continue
		}
		if d := abs(len(c.Slices[ss[0]].Endpoints) - 50); d < bestDiff {
			best, bestDiff = i, d
		}
	}
	return func(yield func(Change) bool) {
		if best < 0 {
			return
		}
		s := c.Slices[c.SlicesOf[best][0]]
		old := len(s.Endpoints)
		hostname := s.Endpoints[0].Hostname
		for step := 0; step*13 < old; step++ {
			n := min(13, old-step*13)
			eps := append([]discovery.Endpoint(nil), s.Endpoints[n:]...)
			for range n {
				e := c.endpoint(v1.IPv4Protocol)
				e.Hostname = hostname
				e.Conditions.Ready, e.Conditions.Serving = ptr.To(true), ptr.To(true)
				eps = append(eps, e)
			}
			s.Endpoints = eps
			if !yield(Change{Name: fmt.Sprintf("rollout of %s (%d pods) step %d", c.Services[best].Name, old, step+1), Update: []any{s}, Endpoints: 2 * n}) {
				return
			}
		}
	}
}

// Burst flips the readiness of n endpoints spread over random services:
// one Change holding every slice it touched.
func (c *Cluster) Burst(n int) Change {
	ch := Change{Name: fmt.Sprintf("burst of %d endpoint changes", n)}
	seen := map[*discovery.EndpointSlice]bool{}
	for range n {
		i := c.randomService(func(int) bool { return true })
		s := c.Slices[c.SlicesOf[i][c.rng.IntN(len(c.SlicesOf[i]))]]
		e := &s.Endpoints[c.rng.IntN(len(s.Endpoints))]
		ready := !ptr.Deref(e.Conditions.Ready, true)
		e.Conditions.Ready, e.Conditions.Serving = ptr.To(ready), ptr.To(ready)
		if !seen[s] {
			seen[s] = true
			ch.Update = append(ch.Update, s)
		}
		ch.Endpoints++
	}
	return ch
}

// Probes are the services a data-plane measurement connects to: the
// first, middle and last plain ClusterIP services (IPv4 only, one port,
// at most 20 endpoints) by index.
func (c *Cluster) Probes() []int {
	ok := func(i int) bool {
		s := c.Services[i]
		return s != nil && c.Kinds[i] == KindClusterIP && len(s.Spec.Ports) == 1 && len(s.Spec.IPFamilies) == 1 &&
			len(c.SlicesOf[i]) == 1 && len(c.Slices[c.SlicesOf[i][0]].Endpoints) <= 20
	}
	n := c.Opts.Services
	var out []int
	for _, from := range []int{0, n / 2, n - 1} {
		for d := 0; d < n; d++ {
			if j := from + d; j < n && ok(j) {
				out = append(out, j)
				break
			}
			if j := from - d; j >= 0 && ok(j) {
				out = append(out, j)
				break
			}
		}
	}
	return out
}

// randomService is a random live service that has endpoints and passes
// ok: a few random draws, then the first such after a random start.
func (c *Cluster) randomService(ok func(int) bool) int {
	good := func(i int) bool { return c.Services[i] != nil && len(c.SlicesOf[i]) > 0 && ok(i) }
	for range 64 {
		if i := c.rng.IntN(len(c.Services)); good(i) {
			return i
		}
	}
	start := c.rng.IntN(len(c.Services))
	for d := range len(c.Services) {
		if i := (start + d) % len(c.Services); good(i) {
			return i
		}
	}
	panic("cluster: no service with endpoints left")
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
