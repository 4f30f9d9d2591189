package netns

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Prefix starts the name of every namespace this package creates.
const Prefix = "kpt-"

// Require skips the test unless it runs as root and the `ip` binary and the
// given further tools (for example "nft") are on PATH.
func Require(t testing.TB, tools ...string) {
	t.Helper()
	if reason := Missing(tools...); reason != "" {
		t.Skip("kernel test skipped: " + reason)
	}
}

// Missing says why kernel tests cannot run here ("" when they can): not root,
// or `ip` or one of tools not installed. TestMain uses it to decide whether
// to build anything at all.
func Missing(tools ...string) string {
	if os.Geteuid() != 0 {
		return "needs root to create network namespaces and program the kernel (CI runs as root)"
	}
	for _, tool := range append([]string{"ip"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Sprintf("the %q binary is not installed", tool)
		}
	}
	return ""
}

// RandomID returns n random bytes in hex, for unique names.
func RandomID(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// NS is one network namespace created by the test.
type NS struct {
	// Name is the namespace's name under /run/netns, as `ip netns` knows it.
	Name string
	// Role is the short name the test gave it (for messages).
	Role string

	handle netns.NsHandle
	nl     *netlink.Handle
}

// New creates the namespace Prefix+id+"-"+role with loopback up, and deletes
// it at the end of the test. id groups the namespaces of one topology (see
// RandomID).
func New(t testing.TB, id, role string) *NS {
	t.Helper()
	n, err := create(id, role)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.destroy(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return n
}

func create(id, role string) (*NS, error) {
	name := Prefix + id + "-" + role
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ip netns add %s: %v: %s", name, err, strings.TrimSpace(string(out)))
	}
	n := &NS{Name: name, Role: role, handle: -1}
	h, err := netns.GetFromName(name)
	if err != nil {
		_ = n.destroy()
		return nil, fmt.Errorf("opening netns %s: %w", name, err)
	}
	n.handle = h
	if n.nl, err = netlink.NewHandleAt(h); err != nil {
		_ = n.destroy()
		return nil, fmt.Errorf("netlink handle in %s: %w", name, err)
	}
	if err := n.LinkUp("lo"); err != nil {
		_ = n.destroy()
		return nil, err
	}
	return n, nil
}

// destroy closes our references and deletes the namespace: its interfaces
// (and the veth peers in other namespaces) and nftables tables go with it.
// Sockets created in it must be closed first or they keep it alive.
func (n *NS) destroy() error {
	if n.nl != nil {
		n.nl.Close()
		n.nl = nil
	}
	if n.handle >= 0 {
		_ = n.handle.Close()
		n.handle = -1
	}
	// `ip netns del` can fail with EBUSY for a moment while a process that
	// was in the namespace is still exiting; retry a few times.
	var last error
	for i := 0; i < 20; i++ {
		out, err := exec.Command("ip", "netns", "del", n.Name).CombinedOutput()
		if err == nil {
			return nil
		}
		if _, statErr := os.Stat(filepath.Join("/run/netns", n.Name)); errors.Is(statErr, os.ErrNotExist) {
			return nil
		}
		last = fmt.Errorf("ip netns del %s: %v: %s", n.Name, err, strings.TrimSpace(string(out)))
		time.Sleep(100 * time.Millisecond)
	}
	return last
}

func (n *NS) String() string { return n.Name }

// Do runs fn on an OS thread that has entered the namespace. Sockets fn
// creates belong to the namespace for their whole life and can be used from
// any goroutine afterwards.
func (n *NS) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		// Never unlocked on purpose: the runtime then ends this thread when
		// the goroutine returns, instead of handing it, still in the test
		// namespace, to another goroutine.
		runtime.LockOSThread()
		if err := netns.Set(n.handle); err != nil {
			errc <- fmt.Errorf("entering netns %s: %w", n.Name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// Exec runs a command inside the namespace with `ip netns exec` and returns
// its combined output. It is bounded by timeout.
func (n *NS) Exec(timeout time.Duration, argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Name}, argv...)...)
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("in netns %s: %s: %w: %s", n.Name, strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Sysctl sets a sysctl of this namespace, key in dotted form
// ("net.ipv4.ip_forward"). Only per-namespace (net.*) keys make sense here.
func (n *NS) Sysctl(key, value string) error {
	path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
	return n.Do(func() error {
		// /proc/sys/net resolves against the network namespace of the
		// thread that opens the file, which is ours here.
		if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
			return fmt.Errorf("sysctl %s=%s in netns %s: %w", key, value, n.Name, err)
		}
		return nil
	})
}

// Sysctls sets several sysctls in order, stopping at the first error.
func (n *NS) Sysctls(kv ...string) error {
	if len(kv)%2 != 0 {
		return fmt.Errorf("Sysctls: odd number of arguments")
	}
	for i := 0; i < len(kv); i += 2 {
		if err := n.Sysctl(kv[i], kv[i+1]); err != nil {
			return err
		}
	}
	return nil
}

// ReadSysctl reads a sysctl of this namespace.
func (n *NS) ReadSysctl(key string) (string, error) {
	path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
	var v string
	err := n.Do(func() error {
		b, err := os.ReadFile(path)
		v = strings.TrimSpace(string(b))
		return err
	})
	return v, err
}
