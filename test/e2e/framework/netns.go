package framework

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// netnsDir is where `ip netns add` mounts named network namespaces.
const netnsDir = "/run/netns"

// commandTimeout bounds every helper command (ip, nft): they finish in
// milliseconds, so one that takes longer is stuck, not slow.
const commandTimeout = 30 * time.Second

// AddNamespace creates a network namespace named prefix-<pid>-<random>,
// brings its loopback up and deletes it in t.Cleanup. Processes started inside it with
// StartProcess must be stopped first, which the LIFO order of t.Cleanup
// gives when they are started after this call.
//
// The name carries the test process's PID, so that namespaces left behind
// by a test binary that was killed (a -timeout panic skips cleanups) are
// recognised and deleted by the next run; see sweepStaleNamespaces.
func AddNamespace(t Lifetime, prefix string) string {
	t.Helper()
	return addNamespace(t, prefix)
}

// addNamespace is AddNamespace for any lifetime (a test or the shared
// control plane's).
func addNamespace(t tb, prefix string) string {
	t.Helper()
	sweepOnce.Do(sweepStaleNamespaces)
	name := fmt.Sprintf("%s-%d-%s", prefix, os.Getpid(), randomSuffix(t))
	if _, err := Run(context.Background(), "ip", "netns", "add", name); err != nil {
		t.Fatalf("creating network namespace: %v", err)
	}
	t.Cleanup(func() {
		// `ip netns delete` unmounts the name; the namespace and its
		// interfaces go away with its last process, which the
		// process cleanups have already stopped.
		if _, err := Run(context.Background(), "ip", "netns", "delete", name); err != nil {
			t.Errorf("deleting network namespace: %v", err)
		}
	})
	if _, err := Run(context.Background(), "ip", "-n", name, "link", "set", "lo", "up"); err != nil {
		t.Fatalf("bringing lo up in %s: %v", name, err)
	}
	return name
}

// staleName matches the names AddNamespace makes: prefix-PID-8 hex digits,
// with a prefix starting "kpe2e-".
var staleName = regexp.MustCompile(`^kpe2e-[a-z0-9-]*?-([0-9]+)-[0-9a-f]{8}$`)

var sweepOnce sync.Once

// sweepStaleNamespaces deletes namespaces made by AddNamespace in a test
// process that no longer exists. Processes those tests ran inside them died
// with the test binary (PDEATHSIG), but a mounted namespace outlives its
// processes, veths and addresses included. Namespaces of live processes
// (other test binaries running now) are left alone.
func sweepStaleNamespaces() {
	entries, err := os.ReadDir(netnsDir)
	if err != nil {
		return // none yet
	}
	for _, e := range entries {
		m := staleName.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		pid, err := strconv.Atoi(m[1])
		if err != nil || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat(filepath.Join("/proc", m[1])); err == nil {
			continue // its test is still running
		}
		_, _ = Run(context.Background(), "ip", "netns", "delete", e.Name())
	}
}

func randomSuffix(t tb) string {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatalf("random name: %v", err)
	}
	return hex.EncodeToString(b)
}

// Run runs a short helper command (bounded by commandTimeout) and returns
// its standard output; the error carries the command line and its
// standard error.
func Run(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	return RunUntil(ctx, name, args...)
}

// RunUntil is Run bounded by ctx alone, for a command that may take
// longer than a helper's 30 seconds (an image import on a loaded machine).
func RunUntil(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// RunIn runs a helper command inside the network namespace ns (with
// `ip netns exec`), bounded like Run.
func RunIn(ctx context.Context, ns, name string, args ...string) (string, error) {
	return Run(ctx, "ip", append([]string{"netns", "exec", ns, name}, args...)...)
}

// DialContextIn returns a dial function whose sockets live in the network
// namespace ns, for a test process that itself stays in the root namespace.
//
// A socket belongs to the namespace of the thread that created it, so each
// dial runs on a fresh goroutine locked to its OS thread, which first
// switches that thread into ns. The goroutine ends without unlocking: the Go
// runtime then terminates the thread instead of reusing it, so no goroutine
// can ever run on a thread left in a foreign namespace, even if switching
// failed half way. (Go starts new threads from a clean template thread when
// others are locked, so this is safe.) Only the socket() and connect() calls
// happen on that thread; the connection works from any goroutine afterwards.
//
// Addresses must be IP literals: a host name would be resolved by goroutines
// that are not on the locked thread.
func DialContextIn(ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := inNamespace(ns, func() error {
			var d net.Dialer
			var err error
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}

// ListenIn opens a listener inside the network namespace ns (see
// DialContextIn for how). The listener is closed in t.Cleanup.
func ListenIn(t testing.TB, ns, network, addr string) net.Listener {
	t.Helper()
	var l net.Listener
	err := inNamespace(ns, func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	if err != nil {
		t.Fatalf("listening on %s %s in %s: %v", network, addr, ns, err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// HTTPClientIn is an HTTP client whose connections are made inside the
// network namespace ns, without keep-alive (each request is independent,
// which is what a probe wants), and with a bounded timeout per request.
func HTTPClientIn(ns string) *http.Client {
	return &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			DialContext:       DialContextIn(ns),
			DisableKeepAlives: true,
			Proxy:             nil, // never an HTTP(S)_PROXY from the environment
		},
	}
}

// inNamespace runs f on a new OS thread switched into the network namespace
// ns; the thread is discarded afterwards (see DialContextIn).
func inNamespace(ns string, f func() error) error {
	path := filepath.Join(netnsDir, ns)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread, on purpose: the thread dies with the goroutine.
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("opening network namespace %s: %w", path, err)
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err != nil {
			errc <- fmt.Errorf("entering network namespace %s: %w", ns, err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// namespaceExists reports whether the named network namespace is mounted.
func namespaceExists(ns string) bool {
	_, err := os.Stat(filepath.Join(netnsDir, ns))
	return err == nil
}
