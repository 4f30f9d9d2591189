package harness

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/kproxy/kproxy/test/e2e/framework"
)

// An upstream hollow node is kubemark's hollow proxy (`kubemark
// --morph=proxy`, k8s.io/kubernetes/pkg/proxy/kubemark): upstream
// kube-proxy's ProxyServer with its informers for Services, EndpointSlices
// and ServiceCIDRs (their selectors, protobuf, resync every 30 s) and a
// proxier whose handlers do nothing. It costs the API server what a real
// kube-proxy's watches cost, but programs no rules, so it compares with a
// kproxy hollow node on API cost and per-node resources only.
//
// Each runs as a process of its own, in the control plane's network
// namespace, with its own kubeconfig whose server is a counting TCP
// relay of its own in front of the API server: the bytes the relay
// passes from the API server to that process are the node's API bytes,
// counted on the wire (TLS records) as a kproxy hollow node's are on
// its client's connections.

// upstreamHollow is one kubemark --morph=proxy process.
type upstreamHollow struct {
	name     string
	proc     *framework.Process
	received atomic.Int64
	syncedCh chan struct{}
}

// UpstreamHollowBinary is kubemark's name in the binary directory
// (test/tools/build.sh builds it there).
const UpstreamHollowBinary = "kubemark"

// upstreamHollowBin is kubemark's path, or an error saying how to get it.
func upstreamHollowBin() (string, error) {
	dir, err := framework.BinDir()
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, UpstreamHollowBinary)
	if fi, err := os.Stat(p); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("upstream's hollow proxy %s is not built: run test/tools/build.sh", p)
	}
	return p, nil
}

// startUpstreamHollow starts one kubemark hollow proxy named name behind a
// relay of its own; kubeconfig is a kube-proxy credential for the API
// server. The process and the relay stop in tb's cleanups.
func startUpstreamHollow(ctx context.Context, tb *TB, cp *framework.ControlPlane, bin, kubeconfig, name string) (*upstreamHollow, error) {
	u := &upstreamHollow{name: name, syncedCh: make(chan struct{})}
	server, err := url.Parse(cp.Server)
	if err != nil {
		return nil, err
	}
	l := framework.ListenIn(tb, cp.Namespace, "tcp", "127.0.0.1:0")
	go relay(ctx, l, framework.DialContextIn(cp.Namespace), server.Host, &u.received)

	// The kube-proxy credential, with the relay as the server (the API
	// server's certificate holds 127.0.0.1).
	cfg, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		return nil, err
	}
	for _, c := range cfg.Clusters {
		c.Server = "https://" + l.Addr().String()
	}
	dir := logDirFor(tb)
	own := filepath.Join(dir, name+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, own); err != nil {
		return nil, err
	}
	// kube-proxy's own client defaults (kubemark's are 10 QPS, burst 20).
	u.proc = framework.StartProcess(tb, cp.Namespace, dir, name, bin, "--morph=proxy", "--name="+name,
		"--kubeconfig="+own, "--kube-api-qps=5", "--kube-api-burst=10")
	go u.awaitSynced(ctx)
	return u, nil
}

// Upstream's config controllers log this once their informer's initial
// list has been handed to the (no-op) proxier.
var upstreamSyncedLines = []string{
	`"Caches are synced" controller="service config"`,
	`"Caches are synced" controller="endpoint slice config"`,
}

// awaitSynced closes syncedCh once the process's log says both its
// Services and EndpointSlices are synced.
func (u *upstreamHollow) awaitSynced(ctx context.Context) {
	for {
		if b, err := os.ReadFile(u.proc.Log); err == nil && hasAll(string(b), upstreamSyncedLines) {
			close(u.syncedCh)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-u.proc.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func hasAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// relay accepts connections on l until ctx is done and passes each to
// target (dialed with dial), counting the bytes from target in received.
func relay(ctx context.Context, l net.Listener, dial func(context.Context, string, string) (net.Conn, error), target string, received *atomic.Int64) {
	go func() { <-ctx.Done(); l.Close() }()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			s, err := dial(ctx, "tcp", target)
			if err != nil {
				return
			}
			defer s.Close()
			var wg sync.WaitGroup
			wg.Go(func() {
				_, _ = io.Copy(s, c)
				closeWrite(s)
			})
			_, _ = io.Copy(c, countingConn{Conn: s, n: received})
			closeWrite(c)
			wg.Wait()
		}()
	}
}

// closeWrite half-closes a TCP connection, so the other side sees the end
// of what was relayed.
func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}
