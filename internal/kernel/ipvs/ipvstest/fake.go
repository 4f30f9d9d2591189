// Package ipvstest holds a stateful fake of ipvs.Handle for unit tests of
// ipvs mode's proxier: it keeps virtual and real servers as the kernel
// does, answers with the kernel's errors (syscall.Errno values, so
// errors.Is works alike on the fake and the real Handle; the VM test in
// package ipvs checks that they agree), counts calls per operation and
// lets a test inject errors and set connection counters.
package ipvstest

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"syscall"

	"github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/testutil/faultplan"
)

// Op names one Handle method.
type Op string

// The operations a Fake counts and can fail.
const (
	OpServices          Op = "Services"
	OpAddService        Op = "AddService"
	OpUpdateService     Op = "UpdateService"
	OpDeleteService     Op = "DeleteService"
	OpDestinations      Op = "Destinations"
	OpAddDestination    Op = "AddDestination"
	OpUpdateDestination Op = "UpdateDestination"
	OpDeleteDestination Op = "DeleteDestination"
	OpSetTimeouts       Op = "SetTimeouts"
)

// Schedulers are the schedulers the fake kernel has (Debian's kernel
// builds all of these); AddService with another is ENOENT, as the kernel
// answers when it cannot find or load ip_vs_<name>.
var Schedulers = []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh", "fo", "ovf", "twos"}

type destKey struct {
	addr netip.Addr
	port uint16
}

type service struct {
	svc   ipvs.Service
	dests map[destKey]*ipvs.Destination
	order []destKey // insertion order; the kernel's order differs, compare sorted
}

// Fake is an in-memory ipvs.Handle. The zero value is not usable; call
// New. It is safe for concurrent use.
type Fake struct {
	mu       sync.Mutex
	services map[ipvs.VirtualServer]*service
	order    []ipvs.VirtualServer
	timeouts ipvs.Timeouts
	faultplan.Plan[Op]
	closed bool

	// Hook, when set, runs before every operation with its arguments (d
	// is nil for service operations); an error it returns is the
	// operation's result and nothing changes.
	Hook func(op Op, vs ipvs.VirtualServer, d *ipvs.Destination) error
}

// New returns an empty fake (no virtual servers, the kernel's default
// timeouts 900/120/300).
func New() *Fake {
	return &Fake{
		services: map[ipvs.VirtualServer]*service{},
		timeouts: ipvs.Timeouts{TCP: 900, TCPFin: 120, UDP: 300},
	}
}

var _ ipvs.Handle = (*Fake)(nil)

// Writes returns how many changing calls (add, update, delete of services
// and destinations) were made since the last ResetCalls.
func (f *Fake) Writes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, op := range []Op{OpAddService, OpUpdateService, OpDeleteService, OpAddDestination, OpUpdateDestination, OpDeleteDestination} {
		n += f.Calls(op)
	}
	return n
}

// SetConns sets the connection counters the kernel would report for a
// real server (graceful termination reads them). It fails when the
// service or the destination does not exist.
func (f *Fake) SetConns(vs ipvs.VirtualServer, addr netip.Addr, port uint16, active, inactive int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.services[key(vs)]
	if !ok {
		return fmt.Errorf("no virtual server %v", vs)
	}
	d, ok := s.dests[destKey{addr.Unmap(), port}]
	if !ok {
		return fmt.Errorf("no real server %v:%d in %v", addr, port, vs)
	}
	d.ActiveConns, d.InactiveConns = active, inactive
	return nil
}

// Timeouts returns the timeouts as SetTimeouts left them.
func (f *Fake) Timeouts() ipvs.Timeouts {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.timeouts
}

// Closed says whether Close was called.
func (f *Fake) Closed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}

// key fills in the family as the kernel reports it, so a VirtualServer
// with Family 0 finds its service.
func key(vs ipvs.VirtualServer) ipvs.VirtualServer {
	vs.Addr = vs.Addr.Unmap()
	if vs.Family == 0 {
		// A firewall mark service without a family is IPv4, as the real
		// Handle sends it.
		vs.Family = syscall.AF_INET
		if vs.Addr.Is6() {
			vs.Family = syscall.AF_INET6
		}
	}
	return vs
}

// enter counts the call and returns an injected error, if any. f.mu is
// held.
func (f *Fake) enter(op Op, vs ipvs.VirtualServer, d *ipvs.Destination) error {
	if err := f.Enter(op); err != nil {
		return err
	}
	if f.Hook != nil {
		var dc *ipvs.Destination
		if d != nil {
			c := *d
			dc = &c
		}
		return f.Hook(op, vs, dc)
	}
	return nil
}

// Services implements ipvs.Handle.
func (f *Fake) Services() ([]ipvs.Service, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(OpServices, ipvs.VirtualServer{}, nil); err != nil {
		return nil, err
	}
	out := make([]ipvs.Service, 0, len(f.order))
	for _, k := range f.order {
		out = append(out, f.services[k].svc)
	}
	return out, nil
}

func checkService(s ipvs.Service) error {
	if !s.Addr.IsValid() && s.FWMark == 0 {
		return syscall.EINVAL
	}
	switch s.Protocol {
	case 6, 17, 132:
	case 0:
		if s.FWMark == 0 {
			return syscall.EFAULT // the kernel: unknown protocol
		}
	default:
		return syscall.EFAULT
	}
	return nil
}

// service runs one virtual server operation under the lock, after the
// call is counted (and its fault injected).
func (f *Fake) service(op Op, vs ipvs.VirtualServer, fn func(vs ipvs.VirtualServer) error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	vs = key(vs)
	if err := f.enter(op, vs, nil); err != nil {
		return err
	}
	return fn(vs)
}

// AddService implements ipvs.Handle: EEXIST for a service that exists,
// ENOENT for an unknown scheduler.
func (f *Fake) AddService(s ipvs.Service) error {
	return f.service(OpAddService, s.VirtualServer, func(vs ipvs.VirtualServer) error {
		s.VirtualServer = vs
		if err := checkService(s); err != nil {
			return err
		}
		if _, ok := f.services[vs]; ok {
			return syscall.EEXIST
		}
		if !slices.Contains(Schedulers, s.Scheduler) {
			return syscall.ENOENT
		}
		s.Flags |= ipvs.FlagHashed
		f.services[vs] = &service{svc: s, dests: map[destKey]*ipvs.Destination{}}
		f.order = append(f.order, vs)
		return nil
	})
}

// UpdateService implements ipvs.Handle: ESRCH for a missing service.
func (f *Fake) UpdateService(s ipvs.Service) error {
	return f.service(OpUpdateService, s.VirtualServer, func(vs ipvs.VirtualServer) error {
		cur, ok := f.services[vs]
		if !ok {
			return syscall.ESRCH
		}
		if !slices.Contains(Schedulers, s.Scheduler) {
			return syscall.ENOENT
		}
		s.VirtualServer = vs
		s.Flags |= ipvs.FlagHashed
		cur.svc = s
		return nil
	})
}

// DeleteService implements ipvs.Handle: ESRCH for a missing service. Its
// real servers go with it.
func (f *Fake) DeleteService(vs ipvs.VirtualServer) error {
	return f.service(OpDeleteService, vs, func(vs ipvs.VirtualServer) error {
		if _, ok := f.services[vs]; !ok {
			return syscall.ESRCH
		}
		delete(f.services, vs)
		f.order = slices.DeleteFunc(f.order, func(k ipvs.VirtualServer) bool { return k == vs })
		return nil
	})
}

// Destinations implements ipvs.Handle. A missing service lists nothing
// and is no error, as the kernel's dump answers.
func (f *Fake) Destinations(vs ipvs.VirtualServer) ([]ipvs.Destination, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	vs = key(vs)
	if err := f.enter(OpDestinations, vs, nil); err != nil {
		return nil, err
	}
	s, ok := f.services[vs]
	if !ok {
		return nil, nil
	}
	out := make([]ipvs.Destination, 0, len(s.order))
	for _, k := range s.order {
		out = append(out, *s.dests[k])
	}
	return out, nil
}

// checkFamily: the real Handle refuses a real server of another family
// than its virtual server's before it asks the kernel (which takes one
// only for tunnelling).
func checkFamily(vs ipvs.VirtualServer, d ipvs.Destination) error {
	if vs.FWMark == 0 && d.Addr.Is4() != vs.Addr.Is4() {
		return syscall.EINVAL
	}
	return nil
}

func checkDest(d ipvs.Destination) error {
	if !d.Addr.IsValid() {
		return syscall.EINVAL
	}
	if d.Weight < 0 {
		return syscall.ERANGE
	}
	return nil
}

// destination runs one real server operation: under the lock, after the
// call is counted (and its fault injected), the family checked and the
// virtual server found (ESRCH without it), as the kernel orders its
// checks. check: the real server's fields are checked too.
func (f *Fake) destination(op Op, vs ipvs.VirtualServer, d ipvs.Destination, check bool, fn func(s *service, k destKey, d ipvs.Destination) error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	vs = key(vs)
	d.Addr = d.Addr.Unmap()
	if err := f.enter(op, vs, &d); err != nil {
		return err
	}
	if check {
		if err := checkFamily(vs, d); err != nil {
			return err
		}
	}
	s, ok := f.services[vs]
	if !ok {
		return syscall.ESRCH
	}
	if check {
		if err := checkDest(d); err != nil {
			return err
		}
	}
	return fn(s, destKey{d.Addr, d.Port}, d)
}

// AddDestination implements ipvs.Handle: ESRCH without the service,
// EEXIST for a real server that exists, ERANGE for a negative weight.
func (f *Fake) AddDestination(vs ipvs.VirtualServer, d ipvs.Destination) error {
	return f.destination(OpAddDestination, vs, d, true, func(s *service, k destKey, d ipvs.Destination) error {
		if _, ok := s.dests[k]; ok {
			return syscall.EEXIST
		}
		d.ActiveConns, d.InactiveConns = 0, 0
		s.dests[k] = &d
		s.order = append(s.order, k)
		return nil
	})
}

// UpdateDestination implements ipvs.Handle: ESRCH without the service,
// ENOENT without the real server. It changes the weight only; the
// connection counters stay.
func (f *Fake) UpdateDestination(vs ipvs.VirtualServer, d ipvs.Destination) error {
	return f.destination(OpUpdateDestination, vs, d, true, func(s *service, k destKey, d ipvs.Destination) error {
		cur, ok := s.dests[k]
		if !ok {
			return syscall.ENOENT
		}
		cur.Weight = d.Weight
		return nil
	})
}

// DeleteDestination implements ipvs.Handle: ESRCH without the service,
// ENOENT without the real server.
func (f *Fake) DeleteDestination(vs ipvs.VirtualServer, d ipvs.Destination) error {
	return f.destination(OpDeleteDestination, vs, d, false, func(s *service, k destKey, _ ipvs.Destination) error {
		if _, ok := s.dests[k]; !ok {
			return syscall.ENOENT
		}
		delete(s.dests, k)
		s.order = slices.DeleteFunc(s.order, func(o destKey) bool { return o == k })
		return nil
	})
}

// SetTimeouts implements ipvs.Handle; a zero field keeps its timeout.
func (f *Fake) SetTimeouts(t ipvs.Timeouts) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(OpSetTimeouts, ipvs.VirtualServer{}, nil); err != nil {
		return err
	}
	if t.TCP != 0 {
		f.timeouts.TCP = t.TCP
	}
	if t.TCPFin != 0 {
		f.timeouts.TCPFin = t.TCPFin
	}
	if t.UDP != 0 {
		f.timeouts.UDP = t.UDP
	}
	return nil
}

// Close implements ipvs.Handle.
func (f *Fake) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
}
