package iptables

import (
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/tally"
	"github.com/kproxy/kproxy/internal/proxy/udpflows"
)

// Applied is what the last successful sync left in the kernel. Render reads
// it; only Plan.Commit changes it, after the kernel accepted the plan.
type Applied struct {
	synced   bool
	services map[model.ServicePortName]*svcApplied
	// tallies are the per-sync figures, kept up to date by Commit.
	tallies tally.Tally
	// Rules kproxy owns per table: the fixed ones of the last full sync
	// plus every service port's.
	fixedNAT, fixedFilter int
	natRules, filterRules int
	// endpoints is the sum of the service ports' endpoints (svcApplied's).
	endpoints int
}

// Rules returns how many rules kproxy owns in the nat and filter tables
// (sync_proxy_rules_iptables_total).
func (a *Applied) Rules() (nat, filter int) {
	return a.fixedNAT + a.natRules, a.fixedFilter + a.filterRules
}

// NewApplied returns the state of a kernel kproxy has not written yet.
func NewApplied() *Applied {
	return &Applied{services: map[model.ServicePortName]*svcApplied{}}
}

type svcApplied struct {
	sp *model.ServicePort
	// chains are the service port's own nat chains and a hash of their
	// rules: a partial sync rewrites only chains whose rules changed.
	chains []chainState
	// shared are its rules in the shared chains (KUBE-SERVICES...):
	// a partial sync deletes the ones that went by their exact text.
	shared []sharedRule
	// reachable are the endpoints traffic may be sent to (conntrack).
	reachable []*model.Endpoint
	// flows are the endpoints whose UDP flows were kept (udpflows.Kept):
	// what a later sync compares with to find stale flows. UDP only.
	flows []*model.Endpoint
	stats tally.Port
	// natRules and filterRules count its rules in each table.
	natRules, filterRules int
	// endpoints is how many endpoints the state gave it (all of them,
	// whatever their conditions: upstream's count for large cluster mode).
	endpoints int
}

type chainState struct {
	name string
	hash uint64
}

// sharedRule is a rule in one of the shared chains: spec is what follows
// "-A CHAIN ".
type sharedRule struct {
	table, chain, spec string
}

// Plan is a rendered sync: the iptables-restore inputs and how Applied
// changes once they are applied.
type Plan struct {
	// Restores are the inputs of iptables-restore --noflush, in order.
	// Usually one; a sync that touches more than MaxChainsPerRestore
	// chains is split: first the service ports' own chains (each chunk
	// holds whole service ports, so what the shared chains jump to is
	// always complete), then the shared chains, then the deletion of
	// stale chains. Applying a prefix leaves a working ruleset.
	Restores [][]byte
	Full     bool
	// StaleUDP are UDP endpoints no longer reachable through a service
	// port: conntrack entries that DNAT to them must go once applied.
	StaleUDP []udpflows.Stale
	// NewlyServedUDP are UDP service ports that had no endpoints and now
	// have some: conntrack entries for their IPs (cached rejects) must go.
	NewlyServedUDP []*model.ServicePort
	// Stats of this sync for logs and metrics.
	ServicePorts, Endpoints      int
	NATRules, FilterRules        int
	ChainsWritten, ChainsDeleted int

	services              map[model.ServicePortName]*svcApplied // nil value: gone
	fixedNAT, fixedFilter int
}

// Text joins the restores, each preceded by a comment line when there
// are several (iptables-restore ignores lines starting with '#').
func (p *Plan) Text() string {
	if len(p.Restores) == 1 {
		return string(p.Restores[0])
	}
	var b strings.Builder
	for i, r := range p.Restores {
		b.WriteString("# iptables-restore --noflush, run " + strconv.Itoa(i+1) + " of " + strconv.Itoa(len(p.Restores)) + "\n")
		b.Write(r)
	}
	return b.String()
}

// Commit records the plan as applied.
func (p *Plan) Commit(a *Applied) {
	if p.Full {
		a.services = make(map[model.ServicePortName]*svcApplied, len(p.services))
		a.tallies = tally.Tally{}
		a.natRules, a.filterRules, a.endpoints = 0, 0, 0
		a.fixedNAT, a.fixedFilter = p.fixedNAT, p.fixedFilter
	}
	a.synced = true
	for n, s := range p.services {
		if old, ok := a.services[n]; ok {
			a.count(n, old, -1)
		}
		if s == nil {
			delete(a.services, n)
			continue
		}
		a.services[n] = s
		a.count(n, s, 1)
	}
}

func (a *Applied) count(n model.ServicePortName, s *svcApplied, sign int) {
	a.natRules += sign * s.natRules
	a.filterRules += sign * s.filterRules
	a.endpoints += sign * s.endpoints
	if sign > 0 {
		a.tallies.Add(n, s.stats)
	} else {
		a.tallies.Remove(n, s.stats)
	}
}

// chains returns the names of every own chain of every service port.
func (a *Applied) chains() sets.Set[string] {
	out := sets.New[string]()
	for _, s := range a.services {
		for _, c := range s.chains {
			out.Insert(c.name)
		}
	}
	return out
}
