// Package framework runs a real Kubernetes control plane (etcd and
// kube-apiserver, no controllers, no kubelet) for kproxy's end-to-end tests,
// entirely inside network namespaces of its own.
//
// # Address plan
//
//	198.18.250.0/24, fd00:18:250::/64  the control-plane network: a bridge in
//	                                   the control plane's namespace holds .1 /
//	                                   ::1, each ConnectNamespace adds a veth
//	198.18.250.1:6443                  kube-apiserver (bound to that address only)
//	127.0.0.1:2379                     etcd, inside the control plane's namespace
//	198.19.0.0/16, fd00:19::/112       service ClusterIP ranges (DefaultServiceCIDRs)
//
// 198.18.0.0/15 is reserved for benchmarking (RFC 2544) and fd00::/8 is
// unique-local, so none of this can clash with a real network.
//
// # Reaching the API server
//
// The test process stays in the root network namespace, which has no route
// to 198.18.250.1 and must not carry test traffic. Its client-go clientset
// therefore dials through DialContextIn: each connection's socket is made on
// a throw-away OS thread switched into the control plane's namespace. This
// needs no helper process and no extra listener; connections are long-lived
// (HTTP/2), so the cost of a thread per dial does not matter. Programs under
// test (kproxy) run inside a namespace joined with ConnectNamespace and use
// a kubeconfig from Kubeconfig, reaching https://198.18.250.1:6443 over the
// veth like a node would.
//
// # Binaries
//
// kube-apiserver and etcd come from the separate module test/tools (built by
// test/tools/build.sh into _output/bin), so kproxy's own module never
// depends on k8s.io/kubernetes. See SkipReason and EnvRun for when tests
// skip, build or fail.
//
// Everything Start creates is removed in t.Cleanup, in reverse order
// (API server before etcd: an API server whose etcd went away first hangs on
// shutdown), also when the test fails.
//
// # One control plane per test binary
//
// Shared gives every test of a binary the same control plane, started on
// first use and stopped by StopShared in TestMain; after each test it is
// put back as it started (see shared.go). A package's tests use Shared;
// Start is for a package with a single test, and for the framework's own.
package framework

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// The control-plane network.
var (
	ControlPlaneNet4 = netip.MustParsePrefix("198.18.250.0/24")
	ControlPlaneNet6 = netip.MustParsePrefix("fd00:18:250::/64")
	// ControlPlaneIP4 is the API server's address (and advertise address).
	ControlPlaneIP4 = netip.MustParseAddr("198.18.250.1")
	ControlPlaneIP6 = netip.MustParseAddr("fd00:18:250::1")
	// DefaultServiceCIDRs is --service-cluster-ip-range unless
	// Options.ServiceCIDRs says otherwise: dual-stack, IPv4 primary.
	DefaultServiceCIDRs = []netip.Prefix{
		netip.MustParsePrefix("198.19.0.0/16"),
		netip.MustParsePrefix("fd00:19::/112"),
	}
)

// APIServerPort is the API server's secure port.
const APIServerPort = 6443

// Default bounds of Start.
const (
	defaultReadyTimeout = 2 * time.Minute
	etcdReadyTimeout    = 30 * time.Second
	pollInterval        = 100 * time.Millisecond
)

// Options tune Start. The zero value is a dual-stack control plane.
type Options struct {
	// ServiceCIDRs is --service-cluster-ip-range (one per family, primary
	// first); DefaultServiceCIDRs when empty.
	ServiceCIDRs []netip.Prefix
	// APIServerArgs are extra kube-apiserver flags, after the harness's
	// own (a repeated flag takes the later value).
	APIServerArgs []string
	// ReadyTimeout bounds waiting for etcd and the API server to become
	// ready; 2 minutes when zero (a cold start on a busy 2-core machine is
	// far slower than the usual 3 seconds).
	ReadyTimeout time.Duration
	// Nodes makes the API server one for real nodes (test/cluster), run
	// with a controller manager: Node,RBAC authorization, the
	// NodeRestriction and ServiceAccount admission plugins, privileged
	// pods allowed, and a client certificate (user
	// kube-apiserver-kubelet-client in system:masters) for the kubelets'
	// APIs (logs, exec, port-forward). Flags a list of values (such as
	// --authorization-mode) append to when repeated cannot be changed
	// through APIServerArgs.
	Nodes bool
}

// ControlPlane is a running etcd and kube-apiserver.
type ControlPlane struct {
	// Namespace is the control plane's network namespace.
	Namespace string
	// Dir holds certificates, kubeconfigs, etcd's data and the logs.
	Dir string
	// Server is the API server URL, https://198.18.250.1:6443.
	Server string
	// AdminKubeconfig is a kubeconfig for Server as a member of
	// system:masters, for programs run in a connected namespace.
	AdminKubeconfig string
	// Config and Client reach the API server as admin from the test
	// process (dialing inside Namespace, see the package doc).
	Config *rest.Config
	Client kubernetes.Interface

	Etcd, APIServer *Process
	// EtcdReady and APIServerReady are how long each took from start
	// until healthy (etcd /health, API server /readyz).
	EtcdReady, APIServerReady time.Duration

	ca *authority
	// owner is the lifetime the control plane's processes belong to: the
	// test that called Start, or the shared control plane's suite.
	owner tb
	// apiServerArgv and readyTimeout let StartAPIServer run the API
	// server again as it last ran; baseAPIServerArgv is how Start ran it
	// (WithAPIServerArgs changes apiServerArgv for one test).
	// apiServerRuns counts its runs (each gets a log file of its own).
	apiServerArgv     []string
	baseAPIServerArgv []string
	readyTimeout      time.Duration
	apiServerRuns     int

	mu sync.Mutex
	// links holds the numbers of the veths ConnectNamespace made that
	// still exist; a number is reused once its veth is gone.
	links map[int]bool
	// baseline is what the shared control plane's API held when it
	// became ready (see Reset); nil for a control plane of one test.
	baseline map[objectKey]bool
}

// Start runs etcd and kube-apiserver in a new network namespace and waits
// until the API server is ready. It skips the test when SkipReason says the
// machine cannot run it, unless EnvRun=1 asks for the tests to be mandatory,
// in which case that is a failure; with EnvRun=1 missing binaries are built
// first.
func Start(t testing.TB, opts Options) *ControlPlane {
	t.Helper()
	if reason := SkipReason(); reason != "" {
		if Mandatory() {
			t.Fatalf("%s=1 but: %s", EnvRun, reason)
		}
		t.Skip(reason)
	}
	return start(t, opts)
}

// start is Start without the skip check, for any lifetime: a test's, or
// the shared control plane's (see Shared).
func start(t tb, opts Options) *ControlPlane {
	t.Helper()
	binDir, err := ensureBinaries()
	if err != nil {
		t.Fatalf("control-plane binaries: %v", err)
	}
	if len(opts.ServiceCIDRs) == 0 {
		opts.ServiceCIDRs = DefaultServiceCIDRs
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = defaultReadyTimeout
	}

	cp := &ControlPlane{
		Dir:          t.TempDir(),
		Server:       "https://" + netip.AddrPortFrom(ControlPlaneIP4, APIServerPort).String(),
		readyTimeout: opts.ReadyTimeout,
		owner:        t,
		links:        map[int]bool{},
	}
	cp.Namespace = addNamespace(t, "kpe2e-cp")
	cp.setUpNetwork(t)
	files := cp.writeCredentials(t, opts.ServiceCIDRs)
	if opts.Nodes {
		files.kubeletCert, files.kubeletKey = cp.ClientCertFiles(t, cp.Dir, "kube-apiserver-kubelet-client", "system:masters")
	}

	ctx, cancel := context.WithTimeout(context.Background(), opts.ReadyTimeout)
	defer cancel()

	start := time.Now()
	cp.Etcd, err = startProcess(t, cp.Namespace, cp.Dir, "etcd",
		filepath.Join(binDir, EtcdBinary),
		"--data-dir="+filepath.Join(cp.Dir, "etcd-data"),
		"--listen-client-url=http://127.0.0.1:2379",
		"--listen-peer-url=http://127.0.0.1:2380",
	)
	if err != nil {
		t.Fatalf("etcd: %v", err)
	}
	etcdCtx, etcdCancel := context.WithTimeout(ctx, etcdReadyTimeout)
	defer etcdCancel()
	if err := cp.waitEtcd(etcdCtx); err != nil {
		t.Fatalf("etcd: %v", err)
	}
	cp.EtcdReady = time.Since(start)

	start = time.Now()
	cp.apiServerArgv = append([]string{filepath.Join(binDir, APIServerBinary)}, cp.apiServerArgs(files, opts)...)
	cp.baseAPIServerArgv = cp.apiServerArgv
	cp.apiServerRuns = 1
	if cp.APIServer, err = startProcess(t, cp.Namespace, cp.Dir, "kube-apiserver", cp.apiServerArgv...); err != nil {
		t.Fatalf("kube-apiserver: %v", err)
	}
	if err := cp.waitAPIServer(ctx); err != nil {
		t.Fatalf("kube-apiserver: %v", err)
	}
	cp.APIServerReady = time.Since(start)
	t.Logf("control plane in netns %s: etcd healthy after %s, kube-apiserver ready after %s",
		cp.Namespace, cp.EtcdReady.Round(time.Millisecond), cp.APIServerReady.Round(time.Millisecond))
	return cp
}

// setUpNetwork creates the bridge holding the control plane's addresses;
// ConnectNamespace plugs veths into it. STP off and no forward delay: a new
// port forwards at once.
func (cp *ControlPlane) setUpNetwork(t tb) {
	t.Helper()
	ns := cp.Namespace
	cmds := [][]string{
		{"ip", "-n", ns, "link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0"},
		{"ip", "-n", ns, "addr", "add", prefixOf(ControlPlaneIP4, ControlPlaneNet4).String(), "dev", "br0"},
		// nodad: the address is usable at once instead of after duplicate
		// address detection (about 2 s of "tentative").
		{"ip", "-n", ns, "addr", "add", prefixOf(ControlPlaneIP6, ControlPlaneNet6).String(), "dev", "br0", "nodad"},
		{"ip", "-n", ns, "link", "set", "br0", "up"},
	}
	for _, c := range cmds {
		if _, err := Run(context.Background(), c[0], c[1:]...); err != nil {
			t.Fatalf("control-plane network: %v", err)
		}
	}
}

func prefixOf(a netip.Addr, net netip.Prefix) netip.Prefix {
	return netip.PrefixFrom(a, net.Bits())
}

// credentialFiles are the paths of what writeCredentials wrote.
type credentialFiles struct {
	caCert, servingCert, servingKey, saKey, saPub string
	// kubeletCert and kubeletKey are set with Options.Nodes.
	kubeletCert, kubeletKey string
}

// writeCredentials makes the CA, the API server's serving certificate,
// the service-account signing keys, the admin kubeconfig and the admin
// client configuration.
func (cp *ControlPlane) writeCredentials(t tb, serviceCIDRs []netip.Prefix) credentialFiles {
	t.Helper()
	ca, err := newAuthority()
	if err != nil {
		t.Fatalf("creating the CA: %v", err)
	}
	cp.ca = ca
	// The serving certificate names every address a client may use: the
	// control-plane addresses, loopback, and the first IP of each service
	// range (the "kubernetes" Service, which kproxy programs to reach the
	// API server from pods).
	ips := []netip.Addr{ControlPlaneIP4, ControlPlaneIP6, netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()}
	for _, p := range serviceCIDRs {
		ips = append(ips, p.Masked().Addr().Next())
	}
	serving, err := ca.servingCert("kube-apiserver", ips,
		[]string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"})
	if err != nil {
		t.Fatalf("creating the serving certificate: %v", err)
	}
	saPriv, saPub, err := serviceAccountKeys()
	if err != nil {
		t.Fatalf("creating service account keys: %v", err)
	}
	f := credentialFiles{
		caCert:      cp.CAFile(),
		servingCert: filepath.Join(cp.Dir, "apiserver.crt"),
		servingKey:  filepath.Join(cp.Dir, "apiserver.key"),
		saKey:       cp.ServiceAccountKeyFile(),
		saPub:       filepath.Join(cp.Dir, "sa.pub"),
	}
	if err := writeFiles(map[string][]byte{
		f.caCert: ca.certPEM, f.servingCert: serving.CertPEM, f.servingKey: serving.KeyPEM,
		f.saKey: saPriv, f.saPub: saPub,
	}); err != nil {
		t.Fatalf("writing credentials: %v", err)
	}

	admin, err := ca.clientCert("kpe2e-admin", []string{"system:masters"})
	if err != nil {
		t.Fatalf("creating the admin certificate: %v", err)
	}
	cp.AdminKubeconfig = filepath.Join(cp.Dir, "admin.kubeconfig")
	if err := cp.writeKubeconfig(cp.AdminKubeconfig, "kpe2e-admin", admin); err != nil {
		t.Fatalf("writing the admin kubeconfig: %v", err)
	}
	cp.Config = &rest.Config{
		Host: cp.Server,
		TLSClientConfig: rest.TLSClientConfig{
			CAData: ca.certPEM, CertData: admin.CertPEM, KeyData: admin.KeyPEM,
		},
		Dial:      DialContextIn(cp.Namespace),
		UserAgent: "kproxy-e2e",
		QPS:       100,
		Burst:     200,
	}
	cp.Client, err = kubernetes.NewForConfig(cp.Config)
	if err != nil {
		t.Fatalf("creating the admin client: %v", err)
	}
	return f
}

// apiServerArgs are the kube-apiserver flags: only what a control plane
// without controllers needs, bound to the control-plane address.
func (cp *ControlPlane) apiServerArgs(f credentialFiles, opts Options) []string {
	cidrs := make([]string, len(opts.ServiceCIDRs))
	for i, p := range opts.ServiceCIDRs {
		cidrs[i] = p.String()
	}
	// Without Options.Nodes no controller-manager runs, so no service
	// account would ever exist for a Pod; the ServiceAccount admission
	// plugin would refuse every Pod.
	authz, disabled := "RBAC", "ServiceAccount"
	if opts.Nodes {
		authz, disabled = "Node,RBAC", ""
	}
	args := []string{
		"--etcd-servers=http://127.0.0.1:2379",
		"--bind-address=" + ControlPlaneIP4.String(),
		"--advertise-address=" + ControlPlaneIP4.String(),
		"--secure-port=" + strconv.Itoa(APIServerPort),
		"--service-cluster-ip-range=" + strings.Join(cidrs, ","),
		"--authorization-mode=" + authz,
		"--client-ca-file=" + f.caCert,
		"--tls-cert-file=" + f.servingCert,
		"--tls-private-key-file=" + f.servingKey,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + f.saPub,
		"--service-account-signing-key-file=" + f.saKey,
		"--disable-admission-plugins=" + disabled,
		// Never write self-signed certificates to /var/run/kubernetes.
		"--cert-dir=" + filepath.Join(cp.Dir, "apiserver-certs"),
		"--profiling=false",
		// On SIGTERM, stop the HTTP server 2 s after in-flight requests
		// drained instead of waiting up to --request-timeout (60 s) for
		// long-running ones: an open watch (kproxy's) ends only when its
		// client goes, so StopAPIServer would hang while kproxy runs.
		"--shutdown-send-retry-after=true",
	}
	if opts.Nodes {
		args = append(args,
			"--enable-admission-plugins=NodeRestriction",
			"--allow-privileged=true",
			"--kubelet-preferred-address-types=InternalIP",
			"--kubelet-client-certificate="+f.kubeletCert,
			"--kubelet-client-key="+f.kubeletKey)
	}
	return append(args, opts.APIServerArgs...)
}

// waitEtcd polls etcd's /health until it reports healthy.
func (cp *ControlPlane) waitEtcd(ctx context.Context) error {
	client := HTTPClientIn(cp.Namespace)
	var last error
	for {
		last = func() error {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:2379/health", nil)
			if err != nil {
				return err
			}
			resp, err := client.Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("/health: %s", resp.Status)
			}
			return nil
		}()
		if last == nil {
			return nil
		}
		if err := cp.sleep(ctx, cp.Etcd); err != nil {
			return fmt.Errorf("%w (last probe: %v)", err, last)
		}
	}
}

// waitAPIServer polls /readyz as admin until it answers "ok", then waits for
// the "default" namespace and the "kubernetes" Service.
func (cp *ControlPlane) waitAPIServer(ctx context.Context) error {
	rc := cp.Client.Discovery().RESTClient()
	var last error
	for {
		last = func() error {
			reqCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			body, err := rc.Get().AbsPath("/readyz").DoRaw(reqCtx)
			if err != nil {
				return err
			}
			if strings.TrimSpace(string(body)) != "ok" {
				return fmt.Errorf("/readyz: %q", body)
			}
			// The bootstrap controller creates these after /readyz is
			// ok; tests see a settled cluster (kproxy finds the
			// "kubernetes" Service from its first sync).
			if _, err := cp.Client.CoreV1().Namespaces().Get(reqCtx, metav1.NamespaceDefault, metav1.GetOptions{}); err != nil {
				return err
			}
			_, err = cp.Client.CoreV1().Services(metav1.NamespaceDefault).Get(reqCtx, "kubernetes", metav1.GetOptions{})
			return err
		}()
		if last == nil {
			return nil
		}
		if err := cp.sleep(ctx, cp.APIServer); err != nil {
			return fmt.Errorf("%w (last probe: %v)", err, last)
		}
	}
}

// sleep waits one poll interval; it fails when ctx ends or p exits.
func (cp *ControlPlane) sleep(ctx context.Context, p *Process) error {
	select {
	case <-ctx.Done():
		return fmt.Errorf("not ready in time: %w; last lines of %s:\n%s", ctx.Err(), p.Log, p.Tail(30))
	case <-p.Done():
		return p.exitedError()
	case <-time.After(pollInterval):
		return nil
	}
}

// Link is the peer side of a ConnectNamespace veth.
type Link struct {
	// Name is the interface name inside the connected namespace.
	Name string
	// Addrs are its addresses.
	Addrs []netip.Prefix
}

// ConnectNamespace connects the network namespace ns to the control-plane
// network with a veth pair: one end joins the control plane's bridge, the
// other (returned) gets addrs, which must lie in ControlPlaneNet4 or
// ControlPlaneNet6 (and not be the control plane's own). Each connection
// gets the lowest number n ≥ 1 no other live connection holds; with no
// addrs the namespace gets 198.18.250.(10+n)/24 and fd00:18:250::(10+n)/64. Both ends are created directly in their
// namespaces; the root namespace never sees them. The veth is removed in
// t.Cleanup (deleting either namespace removes it too).
func (cp *ControlPlane) ConnectNamespace(t Lifetime, ns string, addrs ...netip.Prefix) Link {
	t.Helper()
	if !namespaceExists(ns) {
		t.Fatalf("ConnectNamespace: no network namespace %q", ns)
	}
	cp.mu.Lock()
	n := 1
	for cp.links[n] {
		n++
	}
	cp.links[n] = true
	cp.mu.Unlock()
	release := func() {
		cp.mu.Lock()
		delete(cp.links, n)
		cp.mu.Unlock()
	}
	if len(addrs) == 0 {
		if n > 200 {
			release()
			t.Fatalf("ConnectNamespace: more than 200 namespaces connected at once need explicit addresses")
		}
		addrs = []netip.Prefix{
			netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, 250, byte(10 + n)}), ControlPlaneNet4.Bits()),
			netip.PrefixFrom(nthAddr(ControlPlaneNet6, 10+n), ControlPlaneNet6.Bits()),
		}
	}
	for _, a := range addrs {
		if (!ControlPlaneNet4.Contains(a.Addr()) && !ControlPlaneNet6.Contains(a.Addr())) ||
			a.Addr() == ControlPlaneIP4 || a.Addr() == ControlPlaneIP6 {
			release()
			t.Fatalf("ConnectNamespace: %s is not a free address of %s or %s", a, ControlPlaneNet4, ControlPlaneNet6)
		}
	}

	cpSide := fmt.Sprintf("kpv%d", n)
	link := Link{Name: "kpe2e0", Addrs: addrs}
	ctx := context.Background()
	if _, err := Run(ctx, "ip", "-n", cp.Namespace, "link", "add", cpSide, "type", "veth",
		"peer", "name", link.Name, "netns", ns); err != nil {
		release()
		t.Fatalf("ConnectNamespace: %v", err)
	}
	t.Cleanup(func() {
		defer release()
		// Gone already if a namespace was deleted first; nothing to do then.
		if namespaceExists(cp.Namespace) && namespaceExists(ns) {
			if _, err := Run(context.Background(), "ip", "-n", cp.Namespace, "link", "del", cpSide); err != nil {
				t.Errorf("removing veth %s: %v", cpSide, err)
			}
		}
		// The addresses are reused by the next namespace connected
		// with this number (a later test of a shared control plane):
		// forget their old MAC addresses, or the API server would
		// answer the new peer at the old one until the entry expires.
		if namespaceExists(cp.Namespace) {
			for _, a := range addrs {
				_, _ = Run(context.Background(), "ip", "-n", cp.Namespace, "neigh", "flush", "to", a.Addr().String())
			}
		}
	})
	cmds := [][]string{{"ip", "-n", cp.Namespace, "link", "set", cpSide, "master", "br0", "up"}}
	for _, a := range addrs {
		c := []string{"ip", "-n", ns, "addr", "add", a.String(), "dev", link.Name}
		if a.Addr().Is6() {
			c = append(c, "nodad")
		}
		cmds = append(cmds, c)
	}
	cmds = append(cmds, []string{"ip", "-n", ns, "link", "set", link.Name, "up"})
	for _, c := range cmds {
		if _, err := Run(ctx, c[0], c[1:]...); err != nil {
			t.Fatalf("ConnectNamespace: %v", err)
		}
	}
	return link
}

// nthAddr is the n-th address of p (n small).
func nthAddr(p netip.Prefix, n int) netip.Addr {
	a := p.Masked().Addr()
	for range n {
		a = a.Next()
	}
	return a
}

// Kubeconfig writes a kubeconfig for Server authenticating with a new
// client certificate for user in groups, and returns its path. RBAC then
// decides what it may do: user "system:kube-proxy" gets exactly the
// permissions of upstream's bootstrap binding system:node-proxier.
func (cp *ControlPlane) Kubeconfig(t Lifetime, user string, groups ...string) string {
	t.Helper()
	kp, err := cp.ca.clientCert(user, groups)
	if err != nil {
		t.Fatalf("client certificate for %s: %v", user, err)
	}
	path := filepath.Join(cp.Dir, strings.NewReplacer(":", "-", "/", "-").Replace(user)+".kubeconfig")
	if err := cp.writeKubeconfig(path, user, kp); err != nil {
		t.Fatalf("writing kubeconfig for %s: %v", user, err)
	}
	return path
}

func (cp *ControlPlane) writeKubeconfig(path, user string, kp keyPair) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kpe2e"] = &clientcmdapi.Cluster{Server: cp.Server, CertificateAuthorityData: cp.ca.certPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: kp.CertPEM, ClientKeyData: kp.KeyPEM}
	cfg.Contexts["kpe2e"] = &clientcmdapi.Context{Cluster: "kpe2e", AuthInfo: user}
	cfg.CurrentContext = "kpe2e"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return err
	}
	return os.Chmod(path, 0o600)
}

// CreateNode creates a Node object named name with the given internal
// addresses, as a kubelet would register it, and deletes it in t.Cleanup.
func (cp *ControlPlane) CreateNode(t testing.TB, name string, addrs ...netip.Addr) *corev1.Node {
	t.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:   name,
		Labels: map[string]string{corev1.LabelHostname: name},
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	created, err := cp.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating node %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = cp.Client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
	})
	if len(addrs) == 0 {
		return created
	}
	// Addresses are status: a separate update, as the kubelet does it.
	for _, a := range addrs {
		created.Status.Addresses = append(created.Status.Addresses,
			corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a.String()})
	}
	created, err = cp.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("setting addresses of node %s: %v", name, err)
	}
	return created
}
