package netns

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"syscall"
	"time"
)

// Outcome classifies what happened to a request.
type Outcome int

const (
	// Answered: an echo server answered.
	Answered Outcome = iota
	// Refused: the connection was refused, by a TCP reset or an ICMP port
	// unreachable (what a "reject" rule or a closed port produces). A reset
	// of an established connection is Failed, not Refused.
	Refused
	// Timeout: nothing came back in time (what a "drop" rule produces).
	Timeout
	// Unreachable: ICMP host/network unreachable, or no route.
	Unreachable
	// Failed: any other error (see Reply.Err).
	Failed
)

func (o Outcome) String() string {
	switch o {
	case Answered:
		return "answered"
	case Refused:
		return "refused"
	case Timeout:
		return "timeout"
	case Unreachable:
		return "unreachable"
	default:
		return "failed"
	}
}

// Classify maps a network error to an Outcome (nil is Answered).
func Classify(err error) Outcome {
	var ne net.Error
	switch {
	case err == nil:
		return Answered
	case errors.Is(err, syscall.ECONNREFUSED):
		return Refused
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return Unreachable
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, syscall.ETIMEDOUT),
		errors.As(err, &ne) && ne.Timeout():
		return Timeout
	default:
		return Failed
	}
}

// Reply is the result of one request: who answered and what source address
// the server saw, or how it failed.
type Reply struct {
	Outcome Outcome
	// Server is the echo server's name; Peer the address it saw the
	// request come from (IPv4-mapped addresses unmapped).
	Server string
	Peer   netip.AddrPort
	// Local is the client socket's own address.
	Local netip.AddrPort
	Err   error
	// Took is how long the request took, to tell a quick reject from a
	// timeout.
	Took time.Duration
}

func (r Reply) String() string {
	if r.Outcome == Answered {
		return fmt.Sprintf("answered by %s (saw %s)", r.Server, r.Peer)
	}
	return fmt.Sprintf("%s after %v: %v", r.Outcome, r.Took.Round(time.Millisecond), r.Err)
}

// DialOptions tune a request.
type DialOptions struct {
	// Source binds the client socket to this local address (zero: chosen
	// by routing); SourcePort to this port (0: ephemeral).
	Source     netip.Addr
	SourcePort int
	// Timeout bounds the whole request; 0 means DefaultTimeout.
	Timeout time.Duration
}

// DefaultTimeout bounds a request when DialOptions.Timeout is 0. Traffic
// between namespaces answers in well under a millisecond; the margin covers
// a loaded machine and one lost SYN (retransmitted after 1 s).
const DefaultTimeout = 3 * time.Second

func (o DialOptions) timeout() time.Duration {
	if o.Timeout > 0 {
		return o.Timeout
	}
	return DefaultTimeout
}

func (o DialOptions) local(network string) net.Addr {
	if !o.Source.IsValid() && o.SourcePort == 0 {
		return nil
	}
	var ip net.IP
	if o.Source.IsValid() {
		ip = o.Source.AsSlice()
	}
	if network == "udp" {
		return &net.UDPAddr{IP: ip, Port: o.SourcePort}
	}
	return &net.TCPAddr{IP: ip, Port: o.SourcePort}
}

// parseGreeting reads "<name> <addr>" as the echo servers write it.
func parseGreeting(line string) (string, netip.AddrPort, error) {
	name, addr, ok := strings.Cut(strings.TrimSpace(line), " ")
	if !ok {
		return "", netip.AddrPort{}, fmt.Errorf("unexpected answer %q", line)
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return "", netip.AddrPort{}, fmt.Errorf("unexpected answer %q: %w", line, err)
	}
	return name, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

func addrPortOf(a net.Addr) netip.AddrPort {
	if a == nil {
		return netip.AddrPort{}
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// DialTCP opens a TCP connection from inside the namespace. The socket is
// created (and connects) on a thread in the namespace; the returned
// connection can be used from anywhere.
func (n *NS) DialTCP(dst netip.AddrPort, o DialOptions) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() error {
		d := net.Dialer{Timeout: o.timeout(), LocalAddr: o.local("tcp")}
		var err error
		c, err = d.Dial("tcp", dst.String())
		return err
	})
	return c, err
}

// DialUDP opens a connected UDP socket from inside the namespace.
func (n *NS) DialUDP(dst netip.AddrPort, o DialOptions) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() error {
		d := net.Dialer{LocalAddr: o.local("udp")}
		var err error
		c, err = d.Dial("udp", dst.String())
		return err
	})
	return c, err
}

// Request sends one request to dst from inside the namespace (network "tcp",
// "udp" or "sctp") and reports who answered, or how it failed.
func (n *NS) Request(network string, dst netip.AddrPort, o DialOptions) Reply {
	start := time.Now()
	r := n.request(network, dst, o)
	r.Took = time.Since(start)
	r.Outcome = Classify(r.Err)
	return r
}

func (n *NS) request(network string, dst netip.AddrPort, o DialOptions) Reply {
	deadline := time.Now().Add(o.timeout())
	switch network {
	case "tcp", "sctp":
		dial := n.DialTCP
		if network == "sctp" {
			dial = n.DialSCTP
		}
		c, err := dial(dst, o)
		if err != nil {
			return Reply{Err: err}
		}
		defer c.Close()
		_ = c.SetDeadline(deadline)
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return Reply{Err: err, Local: addrPortOf(c.LocalAddr())}
		}
		name, peer, err := parseGreeting(line)
		return Reply{Server: name, Peer: peer, Err: err, Local: addrPortOf(c.LocalAddr())}
	case "udp":
		c, err := n.DialUDP(dst, o)
		if err != nil {
			return Reply{Err: err}
		}
		defer c.Close()
		return UDPAsk(c, deadline)
	default:
		return Reply{Err: fmt.Errorf("unsupported network %q", network)}
	}
}

// UDPAsk sends one datagram on an open (connected) UDP socket and reads the
// answer until deadline. Use it to send several requests from the same
// source port (DialUDP once, UDPAsk many times).
func UDPAsk(c net.Conn, deadline time.Time) Reply {
	start := time.Now()
	r := func() Reply {
		_ = c.SetDeadline(deadline)
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return Reply{Err: err}
		}
		buf := make([]byte, 2048)
		k, err := c.Read(buf)
		if err != nil {
			return Reply{Err: err, Local: addrPortOf(c.LocalAddr())}
		}
		name, peer, err := parseGreeting(string(buf[:k]))
		return Reply{Server: name, Peer: peer, Err: err, Local: addrPortOf(c.LocalAddr())}
	}()
	r.Took = time.Since(start)
	r.Outcome = Classify(r.Err)
	return r
}

// Session is a long-lived TCP connection to an echo server.
type Session struct {
	// Greeting is what the server said on connect: who it is and the
	// source address it saw.
	Greeting Reply

	c net.Conn
	r *bufio.Reader
}

// OpenSession opens a long-lived TCP connection and reads the greeting.
func (n *NS) OpenSession(dst netip.AddrPort, o DialOptions) (*Session, error) {
	c, err := n.DialTCP(dst, o)
	if err != nil {
		return nil, err
	}
	s := &Session{c: c, r: bufio.NewReader(c)}
	_ = c.SetDeadline(time.Now().Add(o.timeout()))
	line, err := s.r.ReadString('\n')
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("reading the greeting from %s: %w", dst, err)
	}
	name, peer, err := parseGreeting(line)
	if err != nil {
		c.Close()
		return nil, err
	}
	s.Greeting = Reply{Outcome: Answered, Server: name, Peer: peer, Local: addrPortOf(c.LocalAddr())}
	return s, nil
}

// Echo sends one line on the session and returns the server's answer
// ("<server name> <msg>").
func (s *Session) Echo(msg string, timeout time.Duration) (string, error) {
	_ = s.c.SetDeadline(time.Now().Add(timeout))
	if _, err := fmt.Fprintf(s.c, "%s\n", msg); err != nil {
		return "", err
	}
	line, err := s.r.ReadString('\n')
	return strings.TrimSuffix(line, "\n"), err
}

// Close closes the session.
func (s *Session) Close() error { return s.c.Close() }

// HTTPGet fetches url from inside the namespace and returns the status code
// and body.
func (n *NS) HTTPGet(url string, timeout time.Duration) (int, string, error) {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			ap, err := netip.ParseAddrPort(addr)
			if err != nil {
				return nil, err
			}
			return n.DialTCP(ap, DialOptions{Timeout: timeout})
		},
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: timeout}
	resp, err := cl.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		b.WriteString(sc.Text())
		b.WriteByte('\n')
	}
	return resp.StatusCode, strings.TrimSpace(b.String()), sc.Err()
}
