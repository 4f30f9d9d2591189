package e2e

// deploy/kproxy.yaml is checked three ways: against kproxy itself (its
// KubeProxyConfiguration and DaemonSet args go through kproxy's own config
// and flag code), by reading its RBAC rules, and against a real 1.37
// kube-apiserver (server-side apply dry run of every object, then the RBAC
// objects applied for real and probed with SubjectAccessReviews).
//
// Addresses: none of its own; the control plane is the framework's
// (198.18.250.1:6443).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/test/e2e/framework"
)

const (
	deployManifest = "deploy/kproxy.yaml"
	deployNS       = "kube-system"
	deployName     = "kproxy"
	deployConfigCM = "kproxy-config-v1"
	// deploySAUser is how the API server names the DaemonSet's pods.
	deploySAUser = "system:serviceaccount:" + deployNS + ":" + deployName
	applyManager = "kproxy-e2e"
)

// loadDeployObjects reads every object of deploy/kproxy.yaml, in order.
func loadDeployObjects(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	data := readRepoFile(t, deployManifest)
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", deployManifest, err)
		}
		if len(m) == 0 {
			continue // an empty document between two "---"
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	if len(objs) == 0 {
		t.Fatalf("%s holds no objects", deployManifest)
	}
	return objs
}

// deployObject finds kind/name among objs and converts it into out.
func deployObject(t *testing.T, objs []*unstructured.Unstructured, kind, name string, out any) {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, out); err != nil {
				t.Fatalf("%s %s: %v", kind, name, err)
			}
			return
		}
	}
	t.Fatalf("%s has no %s %s", deployManifest, kind, name)
}

func TestDeployManifestObjects(t *testing.T) {
	objs := loadDeployObjects(t)
	var got []string
	for _, o := range objs {
		got = append(got, o.GetKind()+"/"+o.GetName())
		// Cluster-scoped kinds must not carry a namespace, namespaced ones
		// must all go to kube-system (the manifest has no Namespace).
		clusterScoped := o.GetKind() == "ClusterRole" || o.GetKind() == "ClusterRoleBinding"
		if clusterScoped && o.GetNamespace() != "" {
			t.Errorf("%s/%s: cluster-scoped but has namespace %q", o.GetKind(), o.GetName(), o.GetNamespace())
		}
		if !clusterScoped && o.GetNamespace() != deployNS {
			t.Errorf("%s/%s: namespace %q, want %q", o.GetKind(), o.GetName(), o.GetNamespace(), deployNS)
		}
	}
	want := []string{"ServiceAccount/kproxy", "ClusterRole/kproxy", "ClusterRoleBinding/kproxy", "ConfigMap/" + deployConfigCM, "DaemonSet/kproxy"}
	if !slices.Equal(got, want) {
		t.Errorf("objects = %v, want %v", got, want)
	}
}

// TestDeployConfig runs the ConfigMap's KubeProxyConfiguration through
// kproxy's loader, defaults and validation.
func TestDeployConfig(t *testing.T) {
	objs := loadDeployObjects(t)
	var cm corev1.ConfigMap
	deployObject(t, objs, "ConfigMap", deployConfigCM, &cm)
	text, ok := cm.Data["config.conf"]
	if !ok {
		t.Fatalf("ConfigMap %s has no config.conf key (keys: %v)", deployConfigCM, keysOf(cm.Data))
	}
	path := filepath.Join(t.TempDir(), "config.conf")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := config.LoadConfigFile(path)
	if err != nil {
		t.Fatalf("kproxy cannot load the ConfigMap's config: %v", err)
	}
	config.Defaults(c)
	if err := config.Validate(c); err != nil {
		t.Fatalf("kproxy rejects the ConfigMap's config: %v", err)
	}
	if got := config.EffectiveMode(c); got != "nftables" {
		t.Errorf("effective mode = %q, want nftables (the only mode kproxy implements)", got)
	}
	if c.MetricsBindAddress != metricsAddr {
		t.Errorf("metricsBindAddress = %q, want %q", c.MetricsBindAddress, metricsAddr)
	}
	if c.HealthzBindAddress != "0.0.0.0:10256" {
		t.Errorf("healthzBindAddress = %q, want the default 0.0.0.0:10256 the probes use", c.HealthzBindAddress)
	}
}

// TestDeployArgs parses the DaemonSet's args with kproxy's flag set, the
// way the kubelet would expand them, and completes them against the
// ConfigMap mounted where the pod would see it.
func TestDeployArgs(t *testing.T) {
	objs := loadDeployObjects(t)
	var ds appsv1.DaemonSet
	deployObject(t, objs, "DaemonSet", deployName, &ds)
	var cm corev1.ConfigMap
	deployObject(t, objs, "ConfigMap", deployConfigCM, &cm)
	if n := len(ds.Spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("DaemonSet has %d containers, want 1", n)
	}
	ctr := ds.Spec.Template.Spec.Containers[0]

	// The pod's view of the ConfigMap volume, recreated in a temp dir.
	podRoot := t.TempDir()
	for _, vm := range ctr.VolumeMounts {
		for _, v := range ds.Spec.Template.Spec.Volumes {
			if v.Name != vm.Name || v.ConfigMap == nil || v.ConfigMap.Name != deployConfigCM {
				continue
			}
			dir := filepath.Join(podRoot, vm.MountPath)
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			for k, val := range cm.Data {
				if err := os.WriteFile(filepath.Join(dir, k), []byte(val), 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}
	}

	// $(NODE_NAME) must come from the Downward API's spec.nodeName, or
	// kproxy would watch the wrong Node.
	env := map[string]string{}
	for _, e := range ctr.Env {
		if e.Name == "NODE_NAME" {
			if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
				t.Errorf("NODE_NAME is not taken from spec.nodeName: %+v", e)
			}
			env[e.Name] = nodeA
			continue
		}
		env[e.Name] = e.Value
	}
	args := make([]string, len(ctr.Args))
	for i, a := range ctr.Args {
		args[i] = expandEnvRefs(a, env)
		// Paths in flags are the pod's; look them up under podRoot.
		if v, ok := strings.CutPrefix(args[i], "--config="); ok {
			args[i] = "--config=" + filepath.Join(podRoot, v)
		}
	}
	if slices.ContainsFunc(args, func(a string) bool { return strings.Contains(a, "$(") }) {
		t.Fatalf("unexpanded variable in args %v", args)
	}

	o := config.NewOptions()
	fs := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.AddFlags(fs)
	config.AddKlogFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("kproxy's flag parser rejects the DaemonSet args %v: %v", ctr.Args, err)
	}
	if fs.NArg() != 0 {
		t.Errorf("stray positional args %v", fs.Args())
	}
	if err := o.Complete(fs, func(k string) string { return env[k] }); err != nil {
		t.Fatalf("Complete with the DaemonSet args: %v", err)
	}
	if err := o.Validate(); err != nil {
		t.Fatalf("kproxy rejects the DaemonSet's effective config: %v", err)
	}
	if o.Config.HostnameOverride != nodeA {
		t.Errorf("hostnameOverride = %q, want %q from $(NODE_NAME)", o.Config.HostnameOverride, nodeA)
	}
	if got := config.EffectiveMode(o.Config); got != "nftables" {
		t.Errorf("effective mode = %q, want nftables", got)
	}
}

// TestDeployPodSpec pins what the node-level design needs: the host's
// network namespace, the privileges to program it, the host paths and the
// probes on the healthz port.
func TestDeployPodSpec(t *testing.T) {
	var ds appsv1.DaemonSet
	deployObject(t, loadDeployObjects(t), "DaemonSet", deployName, &ds)
	spec := ds.Spec.Template.Spec
	ctr := spec.Containers[0]
	if !spec.HostNetwork {
		t.Error("hostNetwork is false: kproxy would program the pod's own namespace")
	}
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName = %q", spec.PriorityClassName)
	}
	if spec.ServiceAccountName != deployName {
		t.Errorf("serviceAccountName = %q, want %q", spec.ServiceAccountName, deployName)
	}
	if !slices.ContainsFunc(spec.Tolerations, func(tl corev1.Toleration) bool {
		return tl.Operator == corev1.TolerationOpExists && tl.Key == "" && tl.Effect == ""
	}) {
		t.Errorf("no toleration of every taint: %+v", spec.Tolerations)
	}
	if sc := ctr.SecurityContext; sc == nil || !ptr.Deref(sc.Privileged, false) {
		t.Error("container is not privileged: /proc/sys is read-only to unprivileged containers")
	}
	hostPaths := map[string]*corev1.HostPathVolumeSource{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath
		}
	}
	for _, tc := range []struct {
		mount, hostPath string
		readOnly        bool
		typ             corev1.HostPathType
	}{
		{"/run/xtables.lock", "/run/xtables.lock", false, corev1.HostPathFileOrCreate},
		{"/lib/modules", "/lib/modules", true, ""},
	} {
		i := slices.IndexFunc(ctr.VolumeMounts, func(vm corev1.VolumeMount) bool { return vm.MountPath == tc.mount })
		if i < 0 {
			t.Errorf("no volume mounted at %s", tc.mount)
			continue
		}
		vm := ctr.VolumeMounts[i]
		hp := hostPaths[vm.Name]
		if hp == nil || hp.Path != tc.hostPath || ptr.Deref(hp.Type, "") != tc.typ || vm.ReadOnly != tc.readOnly {
			t.Errorf("%s: mount %+v, hostPath %+v; want host %s type %s readOnly %v", tc.mount, vm, hp, tc.hostPath, tc.typ, tc.readOnly)
		}
	}
	for _, tc := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{
		{"liveness", ctr.LivenessProbe, "/livez"},
		{"readiness", ctr.ReadinessProbe, "/healthz"},
	} {
		if tc.probe == nil || tc.probe.HTTPGet == nil {
			t.Errorf("%s probe: not an HTTP probe", tc.name)
			continue
		}
		g := tc.probe.HTTPGet
		if g.Path != tc.path || g.Port.IntValue() != 10256 {
			t.Errorf("%s probe: %s on port %s, want %s on 10256", tc.name, g.Path, g.Port.String(), tc.path)
		}
	}
}

// needed is what kproxy's API source does (list+watch of Services,
// EndpointSlices, its Node and ServiceCIDRs) plus what upstream's system:node-proxier
// grants for events.
var needed = []struct{ group, resource, verb string }{
	{"", "services", "list"},
	{"", "services", "watch"},
	{"discovery.k8s.io", "endpointslices", "list"},
	{"discovery.k8s.io", "endpointslices", "watch"},
	{"", "nodes", "get"},
	{"", "nodes", "list"},
	{"", "nodes", "watch"},
	{"networking.k8s.io", "servicecidrs", "list"},
	{"networking.k8s.io", "servicecidrs", "watch"},
	{"", "events", "create"},
	{"", "events", "patch"},
	{"events.k8s.io", "events", "create"},
	{"events.k8s.io", "events", "patch"},
}

// forbidden are things a node proxy must not be able to do; the ClusterRole
// must stay this narrow.
var forbidden = []struct{ group, resource, verb string }{
	{"", "secrets", "list"},
	{"", "services", "update"},
	{"", "nodes", "patch"},
	{"", "pods", "list"},
	{"discovery.k8s.io", "endpointslices", "create"},
	{"", "endpoints", "list"},
}

func ruleAllows(rules []rbacv1.PolicyRule, group, resource, verb string) bool {
	match := func(list []string, v string) bool {
		return slices.Contains(list, v) || slices.Contains(list, rbacv1.ResourceAll)
	}
	for _, r := range rules {
		if len(r.ResourceNames) == 0 && match(r.APIGroups, group) && match(r.Resources, resource) && match(r.Verbs, verb) {
			return true
		}
	}
	return false
}

// TestDeployRBACRules reads the ClusterRole and its binding.
func TestDeployRBACRules(t *testing.T) {
	objs := loadDeployObjects(t)
	var role rbacv1.ClusterRole
	deployObject(t, objs, "ClusterRole", deployName, &role)
	for _, n := range needed {
		if !ruleAllows(role.Rules, n.group, n.resource, n.verb) {
			t.Errorf("ClusterRole does not allow %s %s (group %q)", n.verb, n.resource, n.group)
		}
	}
	for _, f := range forbidden {
		if ruleAllows(role.Rules, f.group, f.resource, f.verb) {
			t.Errorf("ClusterRole allows %s %s (group %q), which kproxy does not need", f.verb, f.resource, f.group)
		}
	}
	var binding rbacv1.ClusterRoleBinding
	deployObject(t, objs, "ClusterRoleBinding", deployName, &binding)
	if binding.RoleRef.Kind != "ClusterRole" || binding.RoleRef.Name != role.Name {
		t.Errorf("binding refers to %s %s, want ClusterRole %s", binding.RoleRef.Kind, binding.RoleRef.Name, role.Name)
	}
	want := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: deployName, Namespace: deployNS}
	if !slices.Contains(binding.Subjects, want) {
		t.Errorf("binding subjects %+v lack %+v", binding.Subjects, want)
	}
}

// applier server-side applies unstructured objects through discovery.
type applier struct {
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

func newApplier(t *testing.T, cfg *rest.Config) *applier {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &applier{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}
}

func (a *applier) apply(ctx context.Context, obj *unstructured.Unstructured, dryRun bool) error {
	gvk := obj.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return err
	}
	var ri dynamic.ResourceInterface = a.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = a.dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
	}
	data, err := json.Marshal(obj.Object)
	if err != nil {
		return err
	}
	opts := metav1.PatchOptions{
		FieldManager: applyManager,
		Force:        ptr.To(true),
		// Strict: an unknown or duplicated field is an error, not a
		// warning, so a typo in the manifest fails here.
		FieldValidation: metav1.FieldValidationStrict,
	}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err = ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, opts)
	return err
}

// canI asks the API server whether kproxy's service account may do verb on
// group/resource (in namespace ns, "" for all).
func canI(ctx context.Context, t *testing.T, cp *framework.ControlPlane, ns, group, resource, verb string) bool {
	t.Helper()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   deploySAUser,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + deployNS, "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: ns, Group: group, Resource: resource, Verb: verb,
		},
	}}
	got, err := cp.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SubjectAccessReview %s %s: %v", verb, resource, err)
	}
	return got.Status.Allowed
}

// TestDeployApply sends every object to a real API server: a server-side
// apply dry run (admission, defaulting and validation run, nothing is
// stored), then the RBAC objects for real, checked by SubjectAccessReview.
func TestDeployApply(t *testing.T) {
	// Like kube-proxy, kproxy runs privileged; kubeadm and RKE2 run the API
	// server with --allow-privileged=true for that reason, and so does the
	// shared control plane (controlPlaneOptions).
	cp := sharedControlPlane(t)
	objs := loadDeployObjects(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a := newApplier(t, cp.Config)

	for _, o := range objs {
		if err := a.apply(ctx, o, true); err != nil {
			t.Errorf("API server rejects %s %s/%s (dry run): %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
	}
	// A dry run stores nothing: the DaemonSet must not exist afterwards.
	if _, err := cp.Client.AppsV1().DaemonSets(deployNS).Get(ctx, deployName, metav1.GetOptions{}); err == nil {
		t.Error("DaemonSet exists after a dry run")
	}
	if t.Failed() {
		return
	}

	// Before the binding exists the service account may do nothing of
	// this: the probe below can fail.
	if canI(ctx, t, cp, "", "", "services", "list") {
		t.Fatal("service account may list services before the ClusterRoleBinding exists; the RBAC probe proves nothing")
	}
	for _, o := range objs {
		if k := o.GetKind(); k != "ClusterRole" && k != "ClusterRoleBinding" {
			continue
		}
		if err := a.apply(ctx, o, false); err != nil {
			t.Fatalf("applying %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	// RBAC changes reach the authorizer through an informer: wait for the
	// first allowed answer, then check everything.
	deadline := time.Now().Add(30 * time.Second)
	for !canI(ctx, t, cp, "", "", "services", "list") {
		if time.Now().After(deadline) {
			t.Fatal("service account still may not list services 30s after the binding was applied")
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, n := range needed {
		ns := ""
		if n.resource == "events" {
			ns = "default" // events are namespaced; kube-proxy records them in "default"
		}
		if !canI(ctx, t, cp, ns, n.group, n.resource, n.verb) {
			t.Errorf("API server: %s may not %s %s (group %q)", deploySAUser, n.verb, n.resource, n.group)
		}
	}
	for _, f := range forbidden {
		if canI(ctx, t, cp, "", f.group, f.resource, f.verb) {
			t.Errorf("API server: %s may %s %s (group %q)", deploySAUser, f.verb, f.resource, f.group)
		}
	}
}

// envRef is the kubelet's $(VAR) reference in command and args.
var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expandEnvRefs replaces $(VAR) references to variables in env, as the
// kubelet does; references to unknown variables stay as they are.
func expandEnvRefs(s string, env map[string]string) string {
	return envRef.ReplaceAllStringFunc(s, func(ref string) string {
		if v, ok := env[ref[2:len(ref)-1]]; ok {
			return v
		}
		return ref
	})
}

func keysOf[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// readRepoFile reads a file of the repository by its path from the root.
func readRepoFile(t *testing.T, rel string) []byte {
	t.Helper()
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
