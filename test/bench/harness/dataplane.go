package harness

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/test/bench/cluster"
	"github.com/kproxy/kproxy/test/e2e/framework"
)

// Probe is the data plane to one service: new TCP connections from a
// client namespace, through the node namespace holding the proxy's rules,
// to the service's endpoints in a backend namespace.
type Probe struct {
	Which   string  `json:"which"` // first, middle, last
	Service string  `json:"service"`
	P50us   float64 `json:"p50us"`
	P99us   float64 `json:"p99us"`
	PerSec  float64 `json:"connsPerSecond"`
	Conns   int     `json:"conns"`
	Errors  int     `json:"errors"`
}

// Connections per probe, and the links' addresses (198.18.240.0/24 node ↔
// backends, 198.18.241.0/24 node ↔ client; outside the generated pods).
const (
	probeConns  = 500
	nodeBackend = "198.18.240.1"
	backendIP   = "198.18.240.2"
	nodeClient  = "198.18.241.1"
	clientIP    = "198.18.241.2"
)

// measureDataPlane wires a client and a backend namespace to node (whose
// proxy has synced) and connects to the cluster's probe services.
func measureDataPlane(tb *TB, node string, c *cluster.Cluster) []Probe {
	client := framework.AddNamespace(tb, "kpe2e-bcli")
	backend := framework.AddNamespace(tb, "kpe2e-bbe")
	run := func(ns string, args ...string) {
		ctx, cancel := context.WithTimeout(tb.Context(), 30*time.Second)
		defer cancel()
		var err error
		if ns == "" {
			_, err = framework.Run(ctx, args[0], args[1:]...)
		} else {
			_, err = framework.RunIn(ctx, ns, args[0], args[1:]...)
		}
		if err != nil {
			tb.Fatalf("data plane set-up: %v", err)
		}
	}
	run("", "ip", "-n", node, "link", "add", "dp-cli", "type", "veth", "peer", "name", "eth0", "netns", client)
	run("", "ip", "-n", node, "link", "add", "dp-be", "type", "veth", "peer", "name", "eth0", "netns", backend)
	run("", "ip", "-n", node, "addr", "add", nodeClient+"/24", "dev", "dp-cli")
	run("", "ip", "-n", node, "addr", "add", nodeBackend+"/24", "dev", "dp-be")
	run("", "ip", "-n", client, "addr", "add", clientIP+"/24", "dev", "eth0")
	run("", "ip", "-n", backend, "addr", "add", backendIP+"/24", "dev", "eth0")
	for _, l := range [][2]string{{node, "dp-cli"}, {node, "dp-be"}, {client, "eth0"}, {backend, "eth0"}} {
		run("", "ip", "-n", l[0], "link", "set", l[1], "up")
	}
	run("", "ip", "-n", client, "route", "add", "198.19.0.0/16", "via", nodeClient)
	run("", "ip", "-n", backend, "route", "add", "default", "via", nodeBackend)
	run(node, "sysctl", "-qw", "net.ipv4.ip_forward=1")

	probes := c.Probes()
	ports := map[int32]bool{}
	for _, i := range probes {
		s := c.Slices[c.SlicesOf[i][0]]
		ports[*s.Ports[0].Port] = true
		for _, e := range s.Endpoints {
			run("", "ip", "-n", backend, "addr", "add", e.Addresses[0]+"/32", "dev", "eth0")
			run("", "ip", "-n", node, "route", "replace", e.Addresses[0]+"/32", "via", backendIP)
		}
	}
	for p := range ports {
		l := framework.ListenIn(tb, backend, "tcp", "0.0.0.0:"+strconv.Itoa(int(p)))
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
	}
	var out []Probe
	for k, i := range probes {
		dst := netip.AddrPortFrom(cluster.ClusterIP(i), 80)
		// A warm-up (neighbour entries, the listener's first accepts).
		if _, _, _, err := dialLoop(client, dst, 50); err != nil {
			tb.Fatalf("data plane: %v", err)
		}
		lat, errs, elapsed, err := dialLoop(client, dst, probeConns)
		if err != nil {
			tb.Fatalf("data plane: %v", err)
		}
		p := Probe{Which: []string{"first", "middle", "last"}[k], Service: c.Services[i].Name, Conns: len(lat), Errors: errs}
		if len(lat) > 0 {
			slices.Sort(lat)
			p.P50us = float64(lat[len(lat)/2].Microseconds())
			p.P99us = float64(lat[len(lat)*99/100].Microseconds())
			p.PerSec = float64(len(lat)) / elapsed.Seconds()
		}
		out = append(out, p)
	}
	return out
}

// dialLoop connects n times to dst from a thread inside namespace ns and
// returns each successful connect's latency. The thread is discarded
// afterwards (as framework.DialContextIn does).
func dialLoop(ns string, dst netip.AddrPort, n int) ([]time.Duration, int, time.Duration, error) {
	type result struct {
		lat     []time.Duration
		errs    int
		elapsed time.Duration
		err     error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		fd, err := unix.Open(filepath.Join("/run/netns", ns), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			ch <- result{err: err}
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err != nil {
			ch <- result{err: fmt.Errorf("entering %s: %w", ns, err)}
			return
		}
		var r result
		start := time.Now()
		for range n {
			t := time.Now()
			// A raw socket per connect on this thread (net.Dial would
			// run parts of the connect on other threads, outside ns).
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				r.errs++
				continue
			}
			_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &unix.Timeval{Sec: 2})
			_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
			err = unix.Connect(fd, &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()})
			if err == nil {
				r.lat = append(r.lat, time.Since(t))
			} else {
				r.errs++
			}
			unix.Close(fd)
		}
		r.elapsed = time.Since(start)
		ch <- r
	}()
	r := <-ch
	return r.lat, r.errs, r.elapsed, r.err
}
