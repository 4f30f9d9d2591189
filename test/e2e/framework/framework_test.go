package framework

// Addresses in these tests:
//   198.18.250.0/24, fd00:18:250::/64  control-plane network (API server .1)
//   198.18.251.0/24                    a private veth pair between two test namespaces
//   198.19.0.0/16, fd00:19::/112       service ranges of the control plane

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func TestCertificates(t *testing.T) {
	ca, err := newAuthority()
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca.certPEM) {
		t.Fatal("CA PEM not parsable")
	}
	serving, err := ca.servingCert("kube-apiserver",
		[]netip.Addr{ControlPlaneIP4, ControlPlaneIP6}, []string{"kubernetes.default"})
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.clientCert("system:kube-proxy", []string{"g1", "g2"})
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name      string
		kp        keyPair
		usage     x509.ExtKeyUsage
		dnsName   string // verified as server name when set
		wantErr   bool
		wantCN    string
		wantOrgs  []string
		wantIPSAN netip.Addr
	}{
		{name: "serving cert for the control-plane IPv4", kp: serving, usage: x509.ExtKeyUsageServerAuth,
			dnsName: ControlPlaneIP4.String(), wantCN: "kube-apiserver", wantIPSAN: ControlPlaneIP4},
		{name: "serving cert for the control-plane IPv6", kp: serving, usage: x509.ExtKeyUsageServerAuth,
			dnsName: ControlPlaneIP6.String(), wantCN: "kube-apiserver", wantIPSAN: ControlPlaneIP6},
		{name: "serving cert for a DNS name", kp: serving, usage: x509.ExtKeyUsageServerAuth,
			dnsName: "kubernetes.default", wantCN: "kube-apiserver"},
		{name: "serving cert is not for other addresses", kp: serving, usage: x509.ExtKeyUsageServerAuth,
			dnsName: "198.18.250.2", wantErr: true},
		{name: "serving cert is not a client cert", kp: serving, usage: x509.ExtKeyUsageClientAuth, wantErr: true},
		{name: "client cert carries user and groups", kp: client, usage: x509.ExtKeyUsageClientAuth,
			wantCN: "system:kube-proxy", wantOrgs: []string{"g1", "g2"}},
		{name: "client cert is not a serving cert", kp: client, usage: x509.ExtKeyUsageServerAuth, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tls.X509KeyPair(tc.kp.CertPEM, tc.kp.KeyPEM); err != nil {
				t.Fatalf("key does not match certificate: %v", err)
			}
			block, _ := pem.Decode(tc.kp.CertPEM)
			cert, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			_, err = cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: tc.dnsName, KeyUsages: []x509.ExtKeyUsage{tc.usage}})
			if (err != nil) != tc.wantErr {
				t.Fatalf("Verify: err = %v, want error %v", err, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			if cert.Subject.CommonName != tc.wantCN {
				t.Errorf("CN = %q, want %q", cert.Subject.CommonName, tc.wantCN)
			}
			if !slices.Equal(cert.Subject.Organization, tc.wantOrgs) {
				t.Errorf("O = %q, want %q", cert.Subject.Organization, tc.wantOrgs)
			}
			if tc.wantIPSAN.IsValid() && !slices.ContainsFunc(cert.IPAddresses, func(ip net.IP) bool {
				a, _ := netip.AddrFromSlice(ip)
				return a.Unmap() == tc.wantIPSAN
			}) {
				t.Errorf("IP SANs %v lack %s", cert.IPAddresses, tc.wantIPSAN)
			}
		})
	}
}

func TestServiceAccountKeys(t *testing.T) {
	priv, pub, err := serviceAccountKeys()
	if err != nil {
		t.Fatal(err)
	}
	pb, _ := pem.Decode(priv)
	key, err := x509.ParsePKCS8PrivateKey(pb.Bytes)
	if err != nil {
		t.Fatalf("private key: %v", err)
	}
	ub, _ := pem.Decode(pub)
	pk, err := x509.ParsePKIXPublicKey(ub.Bytes)
	if err != nil {
		t.Fatalf("public key: %v", err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		t.Fatalf("private key %T cannot sign", key)
	}
	if !signer.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(pk) {
		t.Fatal("public key does not belong to the private key")
	}
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
}

// TestDialContextIn checks that sockets made through the namespace helpers
// live in the namespace asked for, and that the root namespace (where the
// test runs) cannot reach the same address.
func TestDialContextIn(t *testing.T) {
	requireRoot(t)
	a := AddNamespace(t, "kpe2e-t")
	b := AddNamespace(t, "kpe2e-t")
	ctx := context.Background()
	for _, c := range [][]string{
		{"ip", "-n", a, "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", b},
		{"ip", "-n", a, "addr", "add", "198.18.251.1/24", "dev", "va"},
		{"ip", "-n", b, "addr", "add", "198.18.251.2/24", "dev", "vb"},
		{"ip", "-n", a, "link", "set", "va", "up"},
		{"ip", "-n", b, "link", "set", "vb", "up"},
	} {
		if _, err := Run(ctx, c[0], c[1:]...); err != nil {
			t.Fatal(err)
		}
	}
	l := ListenIn(t, b, "tcp", "198.18.251.2:0")
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "hello from b\n")
			c.Close()
		}
	}()
	addr := l.Addr().String()

	// "Reaches b" means reading b's greeting: a dial that merely connects
	// proves nothing, since the root namespace of a sandbox may have a
	// transparent proxy accepting every TCP connection.
	tests := []struct {
		name        string
		dial        func(ctx context.Context, network, addr string) (net.Conn, error)
		wantReached bool
	}{
		{name: "from namespace a over the veth", dial: DialContextIn(a), wantReached: true},
		{name: "from namespace b itself", dial: DialContextIn(b), wantReached: true},
		{name: "from the root namespace", dial: (&net.Dialer{}).DialContext},
		{name: "from a namespace that does not exist", dial: DialContextIn("kpe2e-none-such")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Repeated: a thread left in a foreign namespace would make a
			// later plain dial reach b where it must not.
			for range 3 {
				if got := reaches(tc.dial, addr); got != tc.wantReached {
					t.Fatalf("reached b: %v, want %v", got, tc.wantReached)
				}
			}
		})
	}
}

// reaches dials addr and reports whether b's greeting came back.
func reaches(dial func(ctx context.Context, network, addr string) (net.Conn, error), addr string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := dial(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	got, _ := io.ReadAll(c)
	return string(got) == "hello from b\n"
}

// TestControlPlane starts the real control plane and checks what the e2e
// tests rely on: the version, that the admin client and a kubeconfig used
// from a connected namespace both work, that RBAC applies to non-admin
// users, and that the API server is not reachable from the root namespace.
func TestControlPlane(t *testing.T) {
	cp := Start(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	v, err := cp.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.GitVersion != "v1.37.2" {
		t.Errorf("server version %q, want v1.37.2 (built with the -X version flag?)", v.GitVersion)
	}

	svc, err := cp.Client.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := svc.Spec.ClusterIPs, []string{"198.19.0.1"}; !slices.Equal(got, want) {
		t.Errorf("kubernetes service ClusterIPs %v, want %v", got, want)
	}

	// From the root namespace the API server must not be reachable. A TCP
	// connect may still succeed (a sandbox's transparent proxy); the TLS
	// handshake against our CA cannot.
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(cp.Config.CAData)
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 2 * time.Second},
		Config: &tls.Config{RootCAs: roots, ServerName: ControlPlaneIP4.String()}}
	if c, err := d.DialContext(ctx, "tcp", strings.TrimPrefix(cp.Server, "https://")); err == nil {
		c.Close()
		t.Error("the API server is reachable from the root namespace")
	}

	// A namespace connected to the control plane reaches the API server
	// with a kubeconfig, as kproxy will.
	node := AddNamespace(t, "kpe2e-t")
	link := cp.ConnectNamespace(t, node)
	if got, want := link.Addrs[0].Addr(), netip.MustParseAddr("198.18.250.11"); got != want {
		t.Errorf("first connected namespace got %s, want %s", got, want)
	}
	kubeconfig := cp.Kubeconfig(t, "system:kube-proxy")
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Dial = DialContextIn(node)
	proxyClient, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := proxyClient.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("system:kube-proxy cannot list EndpointSlices: %v", err)
	}
	_, err = proxyClient.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
	if err == nil || !strings.Contains(err.Error(), "forbidden") {
		t.Errorf("system:kube-proxy listing Secrets: err = %v, want forbidden", err)
	}

	// RBAC as the API server sees it, for the permissions kproxy needs.
	for _, ra := range []authorizationv1.ResourceAttributes{
		{Verb: "watch", Group: "discovery.k8s.io", Resource: "endpointslices"},
		{Verb: "list", Resource: "services"},
		{Verb: "get", Resource: "nodes"},
	} {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: "system:kube-proxy", ResourceAttributes: &ra,
		}}
		res, err := cp.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !res.Status.Allowed {
			t.Errorf("system:kube-proxy may not %s %s: %s", ra.Verb, ra.Resource, res.Status.Reason)
		}
	}

	// Stopping is part of the contract: the cleanup must not hang. Stop
	// here explicitly to see the API server go down before etcd.
	for _, p := range []*Process{cp.APIServer, cp.Etcd} {
		start := time.Now()
		if err := p.Stop(); err != nil {
			t.Error(err)
		}
		t.Logf("%s stopped in %s", p.Name, time.Since(start).Round(time.Millisecond))
	}
	// Both shut down cleanly on SIGTERM (exit status 0), which they only
	// do in this order.
	for _, p := range []*Process{cp.APIServer, cp.Etcd} {
		if err := p.ExitError(); err != nil {
			t.Errorf("%s after SIGTERM: %v", p.Name, err)
		}
	}
}

func TestStaleName(t *testing.T) {
	tests := []struct {
		name    string
		wantPID string // "" when the name is not ours
	}{
		{"kpe2e-cp-1234-0a1b2c3d", "1234"},
		{"kpe2e-node-77-deadbeef", "77"},
		{"kpe2e-t-5-00000000", "5"},
		{"kpe2e-cp-0a1b2c3d", ""},         // old form without a PID
		{"kproxy-test-1234-0a1b2c3d", ""}, // another suite's namespace
		{"kpe2e-cp-1234-0A1B2C3D", ""},
		{"kpe2e-cp-1234-0a1b2c3d-x", ""},
	}
	for _, tc := range tests {
		m := staleName.FindStringSubmatch(tc.name)
		got := ""
		if m != nil {
			got = m[1]
		}
		if got != tc.wantPID {
			t.Errorf("%s: pid %q, want %q", tc.name, got, tc.wantPID)
		}
	}
}

// TestSweepStaleNamespaces: a namespace of a test process that is gone is
// deleted, one of this (live) process is kept.
func TestSweepStaleNamespaces(t *testing.T) {
	requireRoot(t)
	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Fatal(err)
	}
	pidMax, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	dead := fmt.Sprintf("kpe2e-t-%d-%s", pidMax+1, randomSuffix(t)) // no process can have this PID
	if _, err := Run(context.Background(), "ip", "netns", "add", dead); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if namespaceExists(dead) {
			Run(context.Background(), "ip", "netns", "delete", dead)
		}
	})
	live := AddNamespace(t, "kpe2e-t")

	sweepStaleNamespaces()
	if namespaceExists(dead) {
		t.Errorf("%s of a dead process survived the sweep", dead)
	}
	if !namespaceExists(live) {
		t.Errorf("%s of this process was swept", live)
	}
}

// TestAPIServerRestartAndCompaction: StopAPIServer and StartAPIServer keep
// etcd's data and the credentials (the same client reads what it wrote
// before), and after CompactEtcd a watch from an older resource version,
// served from etcd, is answered 410 Gone. It runs on the shared control
// plane, with the flag for that test only (WithAPIServerArgs).
func TestAPIServerRestartAndCompaction(t *testing.T) {
	cp := Shared(t, Options{})
	cp.WithAPIServerArgs(t, "--watch-cache=false")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cms := cp.Client.CoreV1().ConfigMaps(metav1.NamespaceDefault)
	cm, err := cms.Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "restart"}, Data: map[string]string{"v": "1"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	first := cp.APIServer

	if err := cp.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	if _, err := cms.Get(ctx, "restart", metav1.GetOptions{}); err == nil {
		t.Fatal("the API server still answers after StopAPIServer")
	}
	cp.StartAPIServer(t)
	if want := "kube-apiserver-" + strconv.Itoa(cp.apiServerRuns); cp.APIServer == first || cp.APIServer.Name != want || first.Name == want {
		t.Errorf("after StartAPIServer: APIServer %q (was %q), want a new process %s", cp.APIServer.Name, first.Name, want)
	}
	if !slices.Contains(cp.apiServerArgv, "--watch-cache=false") {
		t.Errorf("StartAPIServer dropped WithAPIServerArgs's flag: %v", cp.apiServerArgv)
	}
	if _, err := os.Stat(first.Log); err != nil {
		t.Errorf("the first run's log: %v", err)
	}
	got, err := cms.Get(ctx, "restart", metav1.GetOptions{})
	if err != nil || got.Data["v"] != "1" {
		t.Fatalf("after the restart: %v, %v; want the ConfigMap written before", got, err)
	}

	got.Data["v"] = "2"
	if _, err := cms.Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	rev, err := cp.CompactEtcd(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if old, _ := strconv.ParseInt(cm.ResourceVersion, 10, 64); rev <= old {
		t.Errorf("compacted at revision %d, not after the ConfigMap's %d", rev, old)
	}
	w, err := cms.Watch(ctx, metav1.ListOptions{ResourceVersion: cm.ResourceVersion})
	if err == nil {
		// The API server may answer the watch and send the error as its
		// first event.
		defer w.Stop()
		select {
		case ev := <-w.ResultChan():
			err = apierrors.FromObject(ev.Object)
		case <-ctx.Done():
			t.Fatal("no event on a watch from a compacted resource version")
		}
	}
	if !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
		t.Errorf("watch from compacted resource version %s: %v, want 410 Gone", cm.ResourceVersion, err)
	}
}
