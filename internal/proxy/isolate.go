package proxy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/model"
)

// Failure isolation.
//
// A sync is one atomic kernel transaction (one nf_tables batch, one
// iptables-restore per table), so a single service port the kernel refuses
// makes the whole family's sync fail, and the same input fails again at
// every retry: one tenant's object would keep every other service of the
// node unprogrammed. When a sync fails, the loop therefore looks for the
// service ports responsible, by syncing without them:
//
//  1. The suspects are the ports this sync introduced (changed since the
//     last successful sync, or refused before and due for a retry); if
//     there are none, or the rest fails without them, every port is.
//  2. The state without the suspects is synced in full. If that fails too,
//     the failure is not about any service (a missing binary, the kernel
//     refusing everything): the error is returned as before and nothing is
//     refused.
//  3. The suspects are added back in halves, each half as a partial sync on
//     top of what succeeded: a half that applies stays; a half that fails is
//     split again, down to single ports, which are refused.
//
// Refused ports are left out of every later sync (their traffic is not
// programmed), logged by name with the kernel's error, counted in
// kproxy_sync_refused_service_ports_total and kproxy_refused_service_ports,
// and handed to Options.OnRefused (an Event on the Service when the API
// server is the source). A refused port is tried again, alone, when its
// Service or endpoints change, or after a backoff that starts at
// refuseBackoff and doubles up to refuseBackoffMax.
//
// The cost: with k culprits among n suspects, about 2·k·log2(n) syncs, most
// of them partial; the ones after a refused half are full (whatever the
// backend knew of the kernel is then unknown).

const (
	// maxIsolationTrials bounds the syncs one isolation may take; suspects
	// still untested after that are refused (and retried later) rather
	// than keeping the family's healthy ports waiting.
	maxIsolationTrials = 128
	refuseBackoff      = 30 * time.Second
	refuseBackoffMax   = 10 * time.Minute
)

// refusal is a service port whose rules the kernel refused.
type refusal struct {
	err      error
	attempts int
	retryAt  time.Time
}

// view returns the state the backend should program: the family's state
// without its refused ports. Refused ports that changed since, or whose
// backoff has run out, are taken off the refused list and returned as
// retried (they are in the view again, and must be told to the backend as
// changed). With nothing refused the state itself is returned.
func (l *Loop) view(f v1.IPFamily, now time.Time) (*model.State, sets.Set[model.ServicePortName]) {
	retried := sets.New[model.ServicePortName]()
	refused := l.refused[f]
	for name, r := range refused {
		if l.pending[f].Has(name) || !now.Before(r.retryAt) {
			retried.Insert(name)
			l.retrying[f][name] = r
			delete(refused, name)
		}
	}
	metrics.RefusedServicePorts.WithLabelValues(string(f)).Set(float64(len(refused)))
	st := l.states[f]
	if len(refused) == 0 {
		return st, retried
	}
	return without(st, refused), retried
}

// without returns what a backend reads of st (its resolved service ports
// and their endpoints) with the given service ports left out. It copies
// only those two maps: the claim index behind them (State.Clone) is of no
// use to a backend and is as large again.
func without[T any](st *model.State, out map[model.ServicePortName]T) *model.State {
	c := model.NewState(st.Family)
	for name, sp := range st.Services {
		if _, skip := out[name]; !skip {
			c.Services[name] = sp
		}
	}
	for name, eps := range st.Endpoints {
		if _, skip := out[name]; !skip {
			c.Endpoints[name] = eps
		}
	}
	return c
}

// isolate is called after req failed with err. It finds the service ports
// responsible as described above, refuses them, and leaves the kernel
// programmed with everything else. It returns the result of the last
// successful sync, or the original error when the failure does not depend
// on any service port.
func (l *Loop) isolate(ctx context.Context, f v1.IPFamily, b Backend, req *Request, err error) (*Result, error) {
	if ctx.Err() != nil || hostFault(err) {
		return nil, err
	}
	trials := 0
	// busy is set when a trial failed for the host's reasons: from then
	// on no trial says anything about the service ports it held.
	busy := false
	try := func(st *model.State, changed sets.Set[model.ServicePortName], full bool) (*Result, error) {
		trials++
		r := &Request{State: st, Changed: changed, Node: req.Node, ServiceCIDRs: req.ServiceCIDRs, Full: full, Trial: true, Now: req.Now}
		res, terr := b.Sync(ctx, r)
		if terr != nil {
			klog.V(2).InfoS("Isolation trial failed", "ipFamily", f, "servicePorts", len(st.Services), "full", full, "err", terr)
			busy = busy || hostFault(terr)
		}
		return res, terr
	}

	all := sets.KeySet(req.State.Services)
	suspects := req.Changed.Intersection(all)
	var berr error
	if suspects.Len() > 0 && suspects.Len() < all.Len() {
		_, berr = try(without(req.State, suspects), all, true)
		if berr != nil {
			suspects = all // the rest fails too: anything may be at fault
		}
	} else {
		suspects = all
	}
	if suspects.Equal(all) {
		_, berr = try(without(req.State, all), all, true)
	}
	if berr != nil {
		// Not a service's doing: report the original failure.
		return nil, err
	}

	// good is what passed so far; needFull is set after a refused trial,
	// when a backend whose trials commit cannot trust its view of the
	// kernel. Every trial names all suspects as changed: where trials are
	// only checked, the kernel still holds what it held before the
	// failed sync, and each trial must carry every suspect's difference
	// from that, passed or left out.
	good := without(req.State, suspects)
	needFull := false
	refused := map[model.ServicePortName]error{}
	var bisect func(group []model.ServicePortName)
	bisect = func(group []model.ServicePortName) {
		if len(group) == 0 || busy {
			return
		}
		if trials >= maxIsolationTrials || ctx.Err() != nil {
			for _, n := range group {
				refused[n] = fmt.Errorf("not tested: isolating the failure took %d syncs", trials)
			}
			return
		}
		next := without(good, map[model.ServicePortName]struct{}{})
		for _, n := range group {
			next.Services[n] = req.State.Services[n]
			if eps, ok := req.State.Endpoints[n]; ok {
				next.Endpoints[n] = eps
			}
		}
		_, terr := try(next, suspects, needFull)
		if terr == nil {
			good, needFull = next, false
			return
		}
		needFull = true
		if len(group) == 1 {
			refused[group[0]] = terr
			return
		}
		half := len(group) / 2
		bisect(group[:half])
		bisect(group[half:])
	}
	names := suspects.UnsortedList()
	slices.SortFunc(names, model.ServicePortName.Compare)
	bisect(names)
	if busy {
		// Another program held the host (the xtables lock) during the
		// trials: refusing ports on that evidence would drop healthy
		// services. Trials are only checked where the backend can, so the
		// kernel still holds what it held; the next sync tries again.
		klog.InfoS("Isolation stopped: a trial failed for the host's reasons, not a service's; nothing refused", "ipFamily", f, "trials", trials)
		return nil, err
	}
	// Trials are checked, not committed, where the backend can (Request.
	// Trial); program what passed, in full: a real sync, after which the
	// backend knows what the kernel holds. (Where trials committed, this
	// rewrites the same rules.)
	trials++
	res, terr := b.Sync(ctx, &Request{State: good, Changed: all, Node: req.Node, ServiceCIDRs: req.ServiceCIDRs, Full: true, Now: req.Now})
	if terr != nil {
		return nil, errors.Join(err, fmt.Errorf("after leaving out %d refused service ports: %w", len(refused), terr))
	}
	l.refuse(f, refused, req.Now)
	return res, nil
}

// HostFault is implemented by sync errors that may say the failure was the
// host's, not the input's: xtables.RestoreError when another program held
// the xtables lock past the wait. Such a failure starts no isolation and
// stops one under way.
type HostFault interface{ HostFault() bool }

func hostFault(err error) bool {
	var h HostFault
	return errors.As(err, &h) && h.HostFault()
}

// refuse records refused service ports and reports each.
func (l *Loop) refuse(f v1.IPFamily, refused map[model.ServicePortName]error, now time.Time) {
	for name, why := range refused {
		r := refusal{err: why, attempts: 1}
		if old, ok := l.retrying[f][name]; ok {
			r.attempts = old.attempts + 1
		}
		backoff := refuseBackoff << min(r.attempts-1, 10)
		backoff = min(backoff, refuseBackoffMax)
		r.retryAt = now.Add(backoff)
		l.refused[f][name] = r
		klog.ErrorS(why, "The kernel refused this service port's rules; every other service is programmed without it",
			"servicePort", name.String(), "ipFamily", f, "attempt", r.attempts, "retryIn", backoff)
		metrics.RefusedServicePortsTotal.WithLabelValues(string(f)).Inc()
		if l.opts.OnRefused != nil {
			l.opts.OnRefused(f, name, why)
		}
	}
	clear(l.retrying[f])
	metrics.RefusedServicePorts.WithLabelValues(string(f)).Set(float64(len(l.refused[f])))
}

// Refused lists the service ports of a family whose rules the kernel
// refused and that are left out until they change or are retried.
func (l *Loop) Refused(f v1.IPFamily) []model.ServicePortName {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]model.ServicePortName, 0, len(l.refused[f]))
	for n := range l.refused[f] {
		out = append(out, n)
	}
	slices.SortFunc(out, model.ServicePortName.Compare)
	return out
}
