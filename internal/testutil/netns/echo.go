package netns

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"
)

// The echo protocol, over TCP and UDP alike:
//
//	TCP: on accept the server writes "<name> <remote addr>\n" (remote addr as
//	     the server sees it, host:port). Then, for each line L the client
//	     sends, it writes "<name> <L>\n", until the client closes or stays
//	     idle for IdleTimeout. A client that only wants to learn who answered
//	     reads the first line and closes; a long-lived client keeps the
//	     connection and exchanges lines.
//	UDP: each datagram is answered with "<name> <remote addr>\n".
//
// So a client learns which backend answered and which source address the
// backend saw: the client's own (preserved) or a node's (masqueraded).

// IdleTimeout closes TCP echo connections that stay silent this long, so a
// forgotten connection never outlives the test by much.
const IdleTimeout = 2 * time.Minute

// EchoServer is a TCP or UDP echo server running in a namespace.
type EchoServer struct {
	Name    string
	Network string // "tcp", "udp" or "sctp"
	Port    int

	ln net.Listener
	pc net.PacketConn

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// ServeEcho starts an echo server named name in the namespace, listening on
// every address of the namespace (both families) at port. network is "tcp",
// "udp" or "sctp" (SCTP speaks the TCP protocol; see SCTPSupported). It is closed at the end of the test.
func ServeEcho(t testing.TB, n *NS, name, network string, port int) *EchoServer {
	t.Helper()
	s, err := StartEcho(n, name, network, port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// StartEcho is ServeEcho for callers that manage the server's life
// themselves; Close it.
func StartEcho(n *NS, name, network string, port int) (*EchoServer, error) {
	s := &EchoServer{Name: name, Network: network, Port: port, conns: map[net.Conn]struct{}{}}
	addr := ":" + strconv.Itoa(port)
	var err error
	switch network {
	case "tcp":
		err = n.Do(func() (err error) {
			s.ln, err = net.Listen("tcp", addr)
			return err
		})
	case "udp":
		err = n.Do(func() (err error) {
			s.pc, err = net.ListenPacket("udp", addr)
			return err
		})
	case "sctp":
		s.ln, err = n.listenSCTP(port)
	default:
		err = fmt.Errorf("unsupported network %q", network)
	}
	if err != nil {
		return nil, fmt.Errorf("echo server %s %s/%d in netns %s: %w", name, network, port, n.Name, err)
	}
	s.wg.Add(1)
	if s.ln != nil {
		go s.acceptLoop()
	} else {
		go s.udpLoop()
	}
	return s, nil
}

// Close stops the server and closes its open connections.
func (s *EchoServer) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	if s.ln != nil {
		_ = s.ln.Close()
	}
	if s.pc != nil {
		_ = s.pc.Close()
	}
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *EchoServer) acceptLoop() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serveConn(c)
	}
}

func (s *EchoServer) serveConn(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		_ = c.Close()
	}()
	_ = c.SetDeadline(time.Now().Add(IdleTimeout))
	if _, err := fmt.Fprintf(c, "%s %s\n", s.Name, c.RemoteAddr()); err != nil {
		return
	}
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		_ = c.SetDeadline(time.Now().Add(IdleTimeout))
		if _, err := fmt.Fprintf(c, "%s %s", s.Name, line); err != nil {
			return
		}
	}
}

func (s *EchoServer) udpLoop() {
	defer s.wg.Done()
	buf := make([]byte, 2048)
	for {
		_, from, err := s.pc.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		_, _ = s.pc.WriteTo([]byte(fmt.Sprintf("%s %s\n", s.Name, from)), from)
	}
}
