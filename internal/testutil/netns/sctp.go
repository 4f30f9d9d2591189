package netns

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// SCTP: Go's net package has no SCTP, but a one-to-one SCTP socket
// (SOCK_STREAM, IPPROTO_SCTP) behaves like a TCP socket for bind, listen,
// accept, connect, read and write. The sockets are made with raw syscalls
// inside the namespace and then handed to net.FileListener / net.FileConn,
// which wrap any connected stream socket. Kernels without CONFIG_IP_SCTP
// refuse the socket: check SCTPSupported first.
//
// The CI host's kernel has no SCTP; test/kernel's TestSCTP runs in the
// test VM (internal/testutil/vm) there, through TestInVM.

// ErrSCTPUnsupported wraps the kernel's refusal to open an SCTP socket.
var ErrSCTPUnsupported = errors.New("the kernel cannot open SCTP sockets")

// SCTPSupported returns nil if SCTP sockets can be opened in the namespace,
// else an error wrapping ErrSCTPUnsupported and the errno
// (EPROTONOSUPPORT or ESOCKTNOSUPPORT without CONFIG_IP_SCTP).
func (n *NS) SCTPSupported() error {
	return n.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
		if err != nil {
			if errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.ESOCKTNOSUPPORT) {
				return fmt.Errorf("%w: socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP): %w", ErrSCTPUnsupported, err)
			}
			return fmt.Errorf("socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP): %w", err)
		}
		return unix.Close(fd)
	})
}

// listenSCTP opens a dual-stack SCTP listener on port in the namespace.
func (n *NS) listenSCTP(port int) (net.Listener, error) {
	var ln net.Listener
	err := n.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), "sctp-listener")
		defer f.Close() // FileListener keeps its own duplicate
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err != nil {
			return err
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrInet6{Port: port}); err != nil {
			return err
		}
		if err := unix.Listen(fd, 128); err != nil {
			return err
		}
		ln, err = net.FileListener(f)
		return err
	})
	return ln, err
}

// sctpErrorPoll is how often DialSCTP looks for an ICMP error.
const sctpErrorPoll = 50 * time.Millisecond

// DialSCTP opens an SCTP association from inside the namespace, bounded by
// the options' timeout; the result is used like a TCP connection.
func (n *NS) DialSCTP(dst netip.AddrPort, o DialOptions) (net.Conn, error) {
	var conn net.Conn
	err := n.Do(func() error {
		fam := unix.AF_INET
		if dst.Addr().Is6() {
			fam = unix.AF_INET6
		}
		fd, err := unix.Socket(fam, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), "sctp")
		defer f.Close() // FileConn keeps its own duplicate
		if o.Source.IsValid() || o.SourcePort != 0 {
			if err := unix.Bind(fd, sockaddr(o.Source, o.SourcePort, dst.Addr().Is6())); err != nil {
				return err
			}
		}
		err = unix.Connect(fd, sockaddr(dst.Addr(), int(dst.Port()), dst.Addr().Is6()))
		if err != nil && !errors.Is(err, unix.EINPROGRESS) {
			return err
		}
		// Wait for the association (or its failure), bounded. An ICMP
		// error (a "reject" rule's port unreachable) does not wake the
		// socket: SCTP records it as a soft error (sk_err_soft) unless
		// IP_RECVERR is set and the socket is not busy, and retransmits
		// the INIT until the association times out. TCP fails at once in
		// SYN-SENT. So poll in short slices and look at SO_ERROR, which
		// reports a soft error too, between them.
		deadline := time.Now().Add(o.timeout())
		for {
			left := time.Until(deadline)
			if left <= 0 {
				return fmt.Errorf("sctp connect to %s: %w", dst, os.ErrDeadlineExceeded)
			}
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
			k, err := unix.Poll(pfd, int(min(left, sctpErrorPoll)/time.Millisecond)+1)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				return err
			}
			if k > 0 {
				break
			}
			soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
			if err != nil {
				return err
			}
			if soErr != 0 {
				return fmt.Errorf("sctp connect to %s: %w", dst, unix.Errno(soErr))
			}
		}
		soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			return err
		}
		if soErr != 0 {
			return fmt.Errorf("sctp connect to %s: %w", dst, unix.Errno(soErr))
		}
		conn, err = net.FileConn(f)
		return err
	})
	return conn, err
}

func sockaddr(a netip.Addr, port int, v6 bool) unix.Sockaddr {
	if v6 {
		sa := &unix.SockaddrInet6{Port: port}
		if a.IsValid() {
			sa.Addr = a.As16()
		}
		return sa
	}
	sa := &unix.SockaddrInet4{Port: port}
	if a.IsValid() {
		sa.Addr = a.As4()
	}
	return sa
}
