package framework

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if err := StopShared(); err != nil {
		fmt.Fprintf(os.Stderr, "stopping the shared control plane: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// TestSharedControlPlane: a test leaves the shared control plane dirty (a
// namespace full of objects, one held by a finalizer no controller will
// remove, a Service in "default", a Node, a ClusterRoleBinding, the API
// server running with other flags and then stopped); the next test gets
// the same control plane back as it started, API server running with its
// own flags, and its connected namespace the address the first one had.
func TestSharedControlPlane(t *testing.T) {
	opts := Options{}
	const ns, holder = "shared-dirty", "kproxy.test/hold"
	var first *ControlPlane
	var firstLink Link
	t.Run("dirty", func(t *testing.T) {
		cp := Shared(t, opts)
		first = cp
		firstLink = cp.ConnectNamespace(t, AddNamespace(t, "kpe2e-shared"))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c := cp.Client
		must := func(_ any, err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		must(c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}))
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "web"},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
		}
		must(c.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}))
		must(c.CoreV1().Services(metav1.NamespaceDefault).Create(ctx, svc, metav1.CreateOptions{}))
		must(c.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"198.18.1.1"}}},
		}, metav1.CreateOptions{}))
		must(c.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "held", Finalizers: []string{holder}},
		}, metav1.CreateOptions{}))
		must(c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "shared-node"}}, metav1.CreateOptions{}))
		must(c.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "shared-crb"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "someone"}},
		}, metav1.CreateOptions{}))

		before := cp.APIServer
		cp.WithAPIServerArgs(t, "--watch-cache=false")
		if !slices.Contains(cp.apiServerArgv, "--watch-cache=false") || cp.APIServer == before {
			t.Fatalf("after WithAPIServerArgs: %s (was %s) runs %v", cp.APIServer.Name, before.Name, cp.apiServerArgv)
		}
		// The ConfigMap written before the restart is still there: same etcd.
		must(c.CoreV1().ConfigMaps(ns).Get(ctx, "held", metav1.GetOptions{}))
		if err := cp.StopAPIServer(); err != nil {
			t.Fatal(err)
		}
	})
	if first == nil {
		t.Fatal("the first subtest got no control plane")
	}

	t.Run("clean", func(t *testing.T) {
		cp := Shared(t, opts)
		if cp != first {
			t.Fatal("Shared returned another control plane")
		}
		if !slices.Equal(cp.apiServerArgv, cp.baseAPIServerArgv) {
			t.Errorf("kube-apiserver runs with %v, want Start's flags %v", cp.apiServerArgv, cp.baseAPIServerArgv)
		}
		select {
		case <-cp.APIServer.Done():
			t.Fatal("kube-apiserver is not running")
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c := cp.Client
		gone := map[string]error{}
		_, gone["namespace"] = c.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		_, gone["service in default"] = c.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "web", metav1.GetOptions{})
		_, gone["held ConfigMap"] = c.CoreV1().ConfigMaps(ns).Get(ctx, "held", metav1.GetOptions{})
		_, gone["node"] = c.CoreV1().Nodes().Get(ctx, "shared-node", metav1.GetOptions{})
		_, gone["ClusterRoleBinding"] = c.RbacV1().ClusterRoleBindings().Get(ctx, "shared-crb", metav1.GetOptions{})
		for what, err := range gone {
			if !apierrors.IsNotFound(err) {
				t.Errorf("%s: %v, want not found", what, err)
			}
		}
		svcs, err := c.CoreV1().Services(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(svcs.Items) != 1 || svcs.Items[0].Name != "kubernetes" {
			t.Errorf("services: %d, want only default/kubernetes", len(svcs.Items))
		}
		eps, err := c.DiscoveryV1().EndpointSlices(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range eps.Items {
			if s.Namespace != metav1.NamespaceDefault || s.Labels[discoveryv1.LabelServiceName] != "kubernetes" {
				t.Errorf("EndpointSlice %s/%s left", s.Namespace, s.Name)
			}
		}
		if removed, err := cp.Reset(ctx); err != nil || len(removed) != 0 {
			t.Errorf("Reset of a clean cluster: removed %v, %v", removed, err)
		}
		// The first test's connection number is free again.
		if l := cp.ConnectNamespace(t, AddNamespace(t, "kpe2e-shared")); !slices.Equal(l.Addrs, firstLink.Addrs) {
			t.Errorf("connected with %v, want the first test's free addresses %v", l.Addrs, firstLink.Addrs)
		}
	})
}

// TestSweepStaleDirs: the directory of a test binary that is gone is
// removed, this binary's is kept.
func TestSweepStaleDirs(t *testing.T) {
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(os.TempDir(), fmt.Sprintf("%s%d-test", sharedDirPrefix, gone.Process.Pid))
	own := filepath.Join(os.TempDir(), fmt.Sprintf("%s%d-test", sharedDirPrefix, os.Getpid()))
	for _, d := range []string{stale, own} {
		if err := os.MkdirAll(filepath.Join(d, "etcd-data"), 0o700); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
	}
	sweepStaleDirs()
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("%s of exited pid %d: %v, want removed", stale, gone.Process.Pid, err)
	}
	if _, err := os.Stat(own); err != nil {
		t.Errorf("this binary's %s: %v, want kept", own, err)
	}
}
