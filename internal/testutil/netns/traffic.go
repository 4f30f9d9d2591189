package netns

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"
)

// Intervals of the traffic a test watches across a disruption (a restart,
// a mode switch).
const (
	// ProbeEvery spaces a Prober's new connections.
	ProbeEvery = 20 * time.Millisecond
	// StreamEvery spaces a Stream's echoes.
	StreamEvery = 50 * time.Millisecond
	// LostSYN: a new connection that takes this long had its SYN dropped
	// and retransmitted (after 1 s): a moment without rules, even though
	// the connection succeeded in the end. Between namespaces a
	// connection takes well under a millisecond.
	LostSYN = 900 * time.Millisecond
	// MaxTraffic bounds how long a Prober or Stream runs if never stopped.
	MaxTraffic = 5 * time.Minute
)

// Prober opens a new TCP connection every ProbeEvery until stopped (or
// MaxTraffic passed) and records each that did not reach one of the
// expected servers at once.
type Prober struct {
	Name string
	done chan struct{}
	wg   sync.WaitGroup

	mu       sync.Mutex
	n        int
	failures []string
}

// StartProber starts probing dst from the namespace. Each connection must
// be answered by one of servers within LostSYN; check, if not nil, says
// what else is wrong with a reply (the source address the server saw),
// "" if nothing.
func StartProber(from *NS, name string, dst netip.AddrPort, servers []string, check func(Reply) string) *Prober {
	p := &Prober{Name: name, done: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		deadline := time.After(MaxTraffic)
		for {
			select {
			case <-p.done:
				return
			case <-deadline:
				return
			case <-time.After(ProbeEvery):
			}
			r := from.Request("tcp", dst, DialOptions{})
			var why string
			switch {
			case r.Outcome != Answered:
				why = r.String()
			case !slices.Contains(servers, r.Server):
				why = fmt.Sprintf("%v; want one of %v", r, servers)
			case r.Took >= LostSYN:
				why = fmt.Sprintf("%v took %v: a SYN was lost", r, r.Took.Round(time.Millisecond))
			case check != nil:
				if msg := check(r); msg != "" {
					why = fmt.Sprintf("%v: %s", r, msg)
				}
			}
			p.mu.Lock()
			p.n++
			if why != "" {
				p.failures = append(p.failures, time.Now().Format("15:04:05.000")+" "+why)
			}
			p.mu.Unlock()
		}
	}()
	return p
}

// Stop ends the probing (idempotent) and waits for the last connection.
func (p *Prober) Stop() {
	p.mu.Lock()
	select {
	case <-p.done:
	default:
		close(p.done)
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// Result stops the prober and returns the number of connections made and
// the failures among them.
func (p *Prober) Result() (int, []string) {
	p.Stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n, slices.Clone(p.failures)
}

// Stream is a long-lived TCP connection that echoes a line every
// StreamEvery until stopped; the first error ends it.
type Stream struct {
	Name string
	// Server is the pod the connection reached; it must answer every line.
	Server string
	done   chan struct{}
	wg     sync.WaitGroup

	mu  sync.Mutex
	n   int
	err error
}

// StartStream opens a connection from the namespace to dst, checks that
// one of servers took it, and keeps it busy. It is closed at the end of
// the test.
func StartStream(t testing.TB, from *NS, name string, dst netip.AddrPort, servers []string) *Stream {
	t.Helper()
	sess, err := from.OpenSession(dst, DialOptions{})
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	t.Cleanup(func() { sess.Close() })
	pod := sess.Greeting.Server
	if !slices.Contains(servers, pod) {
		t.Fatalf("stream %s: greeted by %s, want one of %v", name, pod, servers)
	}
	s := &Stream{Name: name, Server: pod, done: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		deadline := time.After(MaxTraffic)
		for i := 0; ; i++ {
			select {
			case <-s.done:
				return
			case <-deadline:
				return
			case <-time.After(StreamEvery):
			}
			msg := fmt.Sprintf("%d", i)
			got, err := sess.Echo(msg, 2*time.Second)
			if err == nil && got != pod+" "+msg {
				err = fmt.Errorf("echo %q answered %q, want %q", msg, got, pod+" "+msg)
			}
			s.mu.Lock()
			if err != nil {
				s.err = fmt.Errorf("%s: %w", time.Now().Format("15:04:05.000"), err)
				s.mu.Unlock()
				return
			}
			s.n++
			s.mu.Unlock()
		}
	}()
	return s
}

// Stop ends the stream's echoes (idempotent); the connection stays open
// until the test ends.
func (s *Stream) Stop() {
	s.mu.Lock()
	select {
	case <-s.done:
	default:
		close(s.done)
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// Result stops the stream and returns the number of lines echoed and the
// error that ended it (nil if it was stopped while healthy).
func (s *Stream) Result() (int, error) {
	s.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n, s.err
}

// Traffic is what a set of probers and streams saw, for the figures.
type Traffic struct {
	Attempted, Failed int // new connections
	Echoes, Broken    int // long-lived streams
}

// Report fails t for every prober failure (the first 10 per prober named)
// and every broken stream, and returns the totals. A failure forgive
// accepts (nil: none) is logged instead and not counted.
func Report(t testing.TB, probers []*Prober, streams []*Stream, forgive func(failure string) bool) Traffic {
	t.Helper()
	var tr Traffic
	for _, p := range probers {
		n, failures := p.Result()
		tr.Attempted += n
		if n == 0 {
			t.Errorf("prober %s made no connection", p.Name)
		}
		named := 0
		for _, f := range failures {
			if forgive != nil && forgive(f) {
				t.Logf("prober %s: %s (forgiven)", p.Name, f)
				continue
			}
			tr.Failed++
			if named++; named <= 10 {
				t.Errorf("prober %s: %s", p.Name, f)
			}
		}
		if named > 10 {
			t.Errorf("prober %s: and %d more failures", p.Name, named-10)
		}
	}
	for _, s := range streams {
		n, err := s.Result()
		tr.Echoes += n
		if err != nil {
			tr.Broken++
			t.Errorf("stream %s to %s broke after %d echoes: %v", s.Name, s.Server, n, err)
		}
	}
	return tr
}
