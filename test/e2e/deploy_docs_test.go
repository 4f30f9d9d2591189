package e2e

// deploy/kproxy.yaml read as the API types with strict decoding, its
// update strategy, DNS, sizing and host mounts compared with kubeadm's
// kube-proxy DaemonSet, and the commands docs/rke2.md and README.md give
// an operator run against it offline: every name they use exists in the
// manifest, every patch applies to it, every kproxy flag parses, every
// ctr flag exists (when Debian's ctr is installed).
//
// Addresses: none.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/internal/config"
)

// deployDocs are the documents whose commands are checked, each from the
// heading given on to the next heading of its level ("": all of it).
var deployDocs = []struct{ path, section string }{{"docs/rke2.md", ""}, {"README.md", "## Deploy"}}

// Memory kproxy was measured to use at 10k Services with 100k endpoints
// (docs/benchmarks.md): the highest resting RSS of any mode (ipvs, 205 MiB)
// and the highest first-sync peak (iptables mode, legacy backend, 375 MiB).
const (
	measuredRestMiB = 205
	measuredPeakMiB = 375
)

// strictManifest decodes every document of deploy/kproxy.yaml into its
// API type, refusing unknown and duplicated fields.
func strictManifest(t *testing.T) (ds *appsv1.DaemonSet, cm *corev1.ConfigMap) {
	t.Helper()
	data := readRepoFile(t, deployManifest)
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatal(err)
		}
		var obj any
		switch tm.APIVersion + " " + tm.Kind {
		case " ":
			continue // comments only
		case "v1 ServiceAccount":
			obj = &corev1.ServiceAccount{}
		case "rbac.authorization.k8s.io/v1 ClusterRole":
			obj = &rbacv1.ClusterRole{}
		case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
			obj = &rbacv1.ClusterRoleBinding{}
		case "v1 ConfigMap":
			cm = &corev1.ConfigMap{}
			obj = cm
		case "apps/v1 DaemonSet":
			ds = &appsv1.DaemonSet{}
			obj = ds
		default:
			t.Fatalf("%s: unexpected %s %s", deployManifest, tm.APIVersion, tm.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			t.Errorf("%s: %s: %v", deployManifest, tm.Kind, err)
		}
	}
	if ds == nil || cm == nil {
		t.Fatalf("%s: no DaemonSet or no ConfigMap", deployManifest)
	}
	return ds, cm
}

// configVolume is the DaemonSet's volume of the ConfigMap.
func configVolume(t *testing.T, ds *appsv1.DaemonSet) corev1.Volume {
	t.Helper()
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil {
			return v
		}
	}
	t.Fatal("the DaemonSet mounts no ConfigMap")
	return corev1.Volume{}
}

var versionedCM = regexp.MustCompile(`^(kproxy-config)-v([0-9]+)$`)

// TestDeployRollout: a change of the image, the env or the config reaches
// one node at a time. The config is a ConfigMap with a versioned name, so
// a change is a new name in the pod template (a rolling update), not an
// in-place edit kproxy on every node reloads at once.
func TestDeployRollout(t *testing.T) {
	ds, cm := strictManifest(t)
	s := ds.Spec.UpdateStrategy
	if s.Type != appsv1.RollingUpdateDaemonSetStrategyType || s.RollingUpdate == nil ||
		s.RollingUpdate.MaxUnavailable == nil || s.RollingUpdate.MaxUnavailable.IntValue() != 1 {
		t.Errorf("updateStrategy %+v, want RollingUpdate with maxUnavailable 1", s)
	}
	if s.RollingUpdate != nil && s.RollingUpdate.MaxSurge != nil && s.RollingUpdate.MaxSurge.IntValue() != 0 {
		t.Errorf("maxSurge %s: two kproxy pods on one node would fight over the rules", s.RollingUpdate.MaxSurge)
	}
	if ds.Spec.MinReadySeconds <= 0 {
		t.Error("minReadySeconds is 0: a pod that fails right after its first sync would not stop the rollout")
	}
	if p := ds.Spec.Template.Spec.Containers[0].ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" {
		t.Error("no /healthz readiness probe: the rollout could not tell a failing pod")
	}
	if !versionedCM.MatchString(cm.Name) {
		t.Errorf("ConfigMap name %q has no version suffix (kproxy-config-vN)", cm.Name)
	}
	if v := configVolume(t, ds); v.ConfigMap.Name != cm.Name {
		t.Errorf("volume %s mounts ConfigMap %q, the manifest's is %q", v.Name, v.ConfigMap.Name, cm.Name)
	}
	if cm.Labels["app.kubernetes.io/name"] != deployName {
		t.Errorf("ConfigMap labels %v lack app.kubernetes.io/name=%s (the uninstall deletes by it)", cm.Labels, deployName)
	}
}

// TestDeployKubeadmParity compares the pod with kubeadm's kube-proxy
// DaemonSet (cmd/kubeadm/app/phases/addons/proxy/manifests.go, v1.37.2)
// where a difference matters on a node.
func TestDeployKubeadmParity(t *testing.T) {
	ds, _ := strictManifest(t)
	spec := ds.Spec.Template.Spec
	ctr := spec.Containers[0]
	// kubeadm leaves dnsPolicy unset, which for a hostNetwork pod is the
	// node's resolver. ClusterFirst(WithHostNet) would make kproxy's
	// lookups depend on the cluster DNS Service, which kproxy programs.
	if spec.DNSPolicy != corev1.DNSDefault {
		t.Errorf("dnsPolicy %q, want Default (the node's resolver)", spec.DNSPolicy)
	}
	// The API server is reached without DNS and without a ClusterIP.
	env := map[string]string{}
	for _, e := range ctr.Env {
		env[e.Name] = e.Value
	}
	if _, err := netip.ParseAddr(env["KUBERNETES_SERVICE_HOST"]); err != nil {
		t.Errorf("KUBERNETES_SERVICE_HOST %q is not an IP address: %v", env["KUBERNETES_SERVICE_HOST"], err)
	}
	if env["KUBERNETES_SERVICE_PORT"] == "" {
		t.Error("KUBERNETES_SERVICE_PORT unset")
	}
	if spec.AutomountServiceAccountToken != nil && !*spec.AutomountServiceAccountToken {
		t.Error("the service account token is not mounted: the in-cluster client has no credentials")
	}
	// kubeadm's /lib/modules has no hostPath type: a node without the
	// directory (modules built in) still runs the pod.
	for _, v := range spec.Volumes {
		if v.HostPath != nil && v.HostPath.Path == "/lib/modules" && ptr.Deref(v.HostPath.Type, "") != "" {
			t.Errorf("/lib/modules has hostPath type %q: the pod would not start on a node without it", *v.HostPath.Type)
		}
		if v.HostPath != nil && v.HostPath.Path == "/run/xtables.lock" && ptr.Deref(v.HostPath.Type, "") != corev1.HostPathFileOrCreate {
			t.Errorf("/run/xtables.lock has hostPath type %v, want FileOrCreate as kubeadm", v.HostPath.Type)
		}
	}
	for _, vm := range ctr.VolumeMounts {
		if vm.MountPath == "/run/xtables.lock" && vm.ReadOnly {
			t.Error("/run/xtables.lock is read-only: iptables cannot take the lock")
		}
	}
	if !slices.ContainsFunc(ctr.Env, func(e corev1.EnvVar) bool {
		return e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	}) || !slices.Contains(ctr.Args, "--hostname-override=$(NODE_NAME)") {
		t.Errorf("the node name does not come from spec.nodeName into --hostname-override: env %v args %v", ctr.Env, ctr.Args)
	}
	if spec.NodeSelector["kubernetes.io/os"] != "linux" {
		t.Errorf("nodeSelector %v lacks kubernetes.io/os=linux", spec.NodeSelector)
	}
}

// TestDeployResources: the memory request covers kproxy at rest and the
// limit its peak, at the size docs/benchmarks.md measured; no CPU limit.
func TestDeployResources(t *testing.T) {
	ds, _ := strictManifest(t)
	res := ds.Spec.Template.Spec.Containers[0].Resources
	mib := func(q resource.Quantity) int64 { return q.Value() >> 20 }
	req, ok := res.Requests[corev1.ResourceMemory]
	if !ok || mib(req) < measuredRestMiB {
		t.Errorf("memory request %s, want at least the measured %d MiB at rest", req.String(), measuredRestMiB)
	}
	lim, ok := res.Limits[corev1.ResourceMemory]
	if !ok || mib(lim) < measuredPeakMiB {
		t.Errorf("memory limit %s, want at least the measured peak %d MiB", lim.String(), measuredPeakMiB)
	}
	if ok && mib(lim) < mib(req) {
		t.Errorf("memory limit %s below the request %s", lim.String(), req.String())
	}
	if _, ok := res.Limits[corev1.ResourceCPU]; ok {
		t.Error("CPU limit set: throttling delays syncs")
	}
}

// docCommands returns the shell commands of a Markdown file: the lines of
// its fenced blocks and its inline code spans that start with a command
// (wrapped spans joined).
func docCommands(t *testing.T, rel, section string) []string {
	t.Helper()
	b := readRepoFile(t, rel)
	text := string(b)
	if section != "" {
		_, after, ok := strings.Cut(text, "\n"+section+"\n")
		if !ok {
			t.Fatalf("%s has no %q", rel, section)
		}
		level := section[:strings.Index(section, " ")+1]
		text, _, _ = strings.Cut(after, "\n"+level)
	}
	var cmds []string
	var prose strings.Builder
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			if l, _, _ := strings.Cut(line, " #"); strings.TrimSpace(l) != "" && !strings.HasPrefix(strings.TrimSpace(l), "#") {
				cmds = append(cmds, strings.TrimSpace(l))
			}
			continue
		}
		prose.WriteString(line + " ")
	}
	for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(prose.String(), -1) {
		c := strings.Join(strings.Fields(m[1]), " ")
		for _, p := range []string{"kubectl ", "kproxy --", "ctr ", "/var/lib/rancher/rke2/bin/ctr "} {
			if strings.HasPrefix(c, p) {
				cmds = append(cmds, c)
			}
		}
	}
	return cmds
}

// argsOf splits a command line into words, single quotes removed.
func argsOf(c string) []string {
	var out []string
	for _, w := range regexp.MustCompile(`(?:'[^']*'|[^\s'])+`).FindAllString(c, -1) {
		out = append(out, strings.ReplaceAll(w, "'", ""))
	}
	return out
}

// flagValue returns the value of -x/--x in args ("--x=v" or "--x v").
func flagValue(args []string, names ...string) (string, bool) {
	for i, a := range args {
		for _, n := range names {
			if v, ok := strings.CutPrefix(a, n+"="); ok {
				return v, true
			}
			if a == n && i+1 < len(args) {
				return args[i+1], true
			}
		}
	}
	return "", false
}

// applyPatch applies a documented strategic merge patch to the manifest's
// DaemonSet and decodes the result strictly.
func applyPatch(t *testing.T, ds *appsv1.DaemonSet, patch string) *appsv1.DaemonSet {
	t.Helper()
	orig, err := json.Marshal(ds)
	if err != nil {
		t.Fatal(err)
	}
	merged, err := strategicpatch.StrategicMergePatch(orig, []byte(patch), appsv1.DaemonSet{})
	if err != nil {
		t.Fatalf("patch %s does not apply to the DaemonSet: %v", patch, err)
	}
	var out appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(merged, &out); err != nil {
		t.Fatalf("patched DaemonSet: %v", err)
	}
	return &out
}

// checkKubectl checks one documented kubectl command against the manifest.
func checkKubectl(t *testing.T, c string, ds *appsv1.DaemonSet, cm *corev1.ConfigMap) {
	args := argsOf(c)
	podLabels := ds.Spec.Template.Labels
	if ns, ok := flagValue(args, "-n", "--namespace"); ok && ns != deployNS {
		t.Errorf("%q: namespace %q, kproxy's objects are in %s", c, ns, deployNS)
	}
	if sel, ok := flagValue(args, "-l", "--selector"); ok {
		k, v, _ := strings.Cut(sel, "=")
		if podLabels[k] != v {
			t.Errorf("%q: selector %s matches no label of kproxy's pods %v", c, sel, podLabels)
		}
		if slices.Contains(args, "configmap") && cm.Labels[k] != v {
			t.Errorf("%q: selector %s matches no label of the ConfigMap %v", c, sel, cm.Labels)
		}
	}
	if fs, ok := flagValue(args, "--field-selector"); ok && !strings.HasPrefix(fs, "spec.nodeName=") {
		t.Errorf("%q: field selector %s, want spec.nodeName=NODE", c, fs)
	}
	cmPrefix := versionedCM.FindStringSubmatch(cm.Name)
	for i, a := range args {
		next := ""
		if i+1 < len(args) {
			next = args[i+1]
		}
		switch {
		case a == "daemonset" || a == "ds":
			if next != deployName {
				t.Errorf("%q: DaemonSet %q, the manifest's is %q", c, next, deployName)
			}
		case strings.HasPrefix(a, "daemonset/") || strings.HasPrefix(a, "ds/"):
			if _, n, _ := strings.Cut(a, "/"); n != deployName {
				t.Errorf("%q: DaemonSet %q, the manifest's is %q", c, n, deployName)
			}
		case a == "configmap" && !strings.HasPrefix(next, "-"):
			if m := versionedCM.FindStringSubmatch(next); m == nil || cmPrefix == nil || m[1] != cmPrefix[1] {
				t.Errorf("%q: ConfigMap %q is not a version of the manifest's %q", c, next, cm.Name)
			}
		case strings.HasPrefix(a, "jsonpath="):
			key := strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(a, "jsonpath={.data."), "}"), `\.`, ".")
			if _, ok := cm.Data[key]; !ok {
				t.Errorf("%q: ConfigMap key %q, the manifest's are %v", c, key, keysOf(cm.Data))
			}
		case strings.HasPrefix(a, "--from-file="):
			if key := filepath.Base(strings.TrimPrefix(a, "--from-file=")); cm.Data[key] == "" {
				t.Errorf("%q: the ConfigMap would get key %q, kproxy reads %v", c, key, keysOf(cm.Data))
			}
		}
	}
	if i := slices.Index(args, "image"); i > 0 && args[i-1] == "set" && i+2 < len(args) {
		name, _, _ := strings.Cut(args[i+2], "=")
		if !slices.ContainsFunc(ds.Spec.Template.Spec.Containers, func(c corev1.Container) bool { return c.Name == name }) {
			t.Errorf("%q: no container %q in the DaemonSet", c, name)
		}
	}
	if slices.Contains(args, "patch") {
		p, ok := flagValue(args, "-p", "--patch")
		if !ok {
			t.Errorf("%q: no -p", c)
			return
		}
		checkPatch(t, c, p, ds)
	}
}

// checkPatch applies a documented patch and checks it changes what it
// means to and nothing else.
func checkPatch(t *testing.T, c, p string, ds *appsv1.DaemonSet) {
	got := applyPatch(t, ds, p)
	if len(got.Spec.Template.Spec.Volumes) != len(ds.Spec.Template.Spec.Volumes) {
		t.Errorf("%q: volumes %d, were %d (the patch adds a volume instead of changing one)", c, len(got.Spec.Template.Spec.Volumes), len(ds.Spec.Template.Spec.Volumes))
	}
	before, after := configVolume(t, ds), configVolume(t, got)
	if before.Name != after.Name {
		t.Errorf("%q: config volume renamed %s -> %s", c, before.Name, after.Name)
	}
	if after.ConfigMap.Name != before.ConfigMap.Name {
		if m := versionedCM.FindStringSubmatch(after.ConfigMap.Name); m == nil || m[0] == before.ConfigMap.Name {
			t.Errorf("%q: ConfigMap %q is not a new version of %q", c, after.ConfigMap.Name, before.ConfigMap.Name)
		}
	}
	for k, v := range ds.Spec.Template.Spec.NodeSelector {
		if got.Spec.Template.Spec.NodeSelector[k] != v {
			t.Errorf("%q: drops nodeSelector %s=%s", c, k, v)
		}
	}
	// Everything but the volume's ConfigMap and the node selector is as
	// the manifest has it.
	a, b := got.DeepCopy(), ds.DeepCopy()
	for _, d := range []*appsv1.DaemonSet{a, b} {
		d.Spec.Template.Spec.NodeSelector = nil
		for i := range d.Spec.Template.Spec.Volumes {
			if v := &d.Spec.Template.Spec.Volumes[i]; v.ConfigMap != nil {
				v.ConfigMap.Name = ""
			}
		}
	}
	aj, _ := json.Marshal(a)
	bj, _ := json.Marshal(b)
	if !bytes.Equal(aj, bj) {
		t.Errorf("%q changes more than the ConfigMap name or the node selector", c)
	}
}

// checkKproxyArgs parses a documented kproxy invocation with kproxy's flags.
func checkKproxyArgs(t *testing.T, c string, args []string) {
	fs := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	config.NewOptions().AddFlags(fs)
	config.AddKlogFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Errorf("%q: kproxy's flags reject %v: %v", c, args, err)
	}
}

// checkCtr checks a documented ctr command: its image is the DaemonSet's,
// the command it runs parses as kproxy's, the host paths it mounts are
// the DaemonSet's, and (with ctr installed) every flag exists in ctr.
func checkCtr(t *testing.T, c string, ds *appsv1.DaemonSet) {
	args := argsOf(c)[1:]
	image := ds.Spec.Template.Spec.Containers[0].Image
	sub := slices.IndexFunc(args, func(a string) bool { return a == "run" || a == "images" })
	if sub < 0 {
		t.Errorf("%q: neither run nor images", c)
		return
	}
	if args[sub] == "run" {
		i := slices.IndexFunc(args, func(a string) bool { return strings.HasPrefix(a, "localhost/kproxy") })
		if i < 0 || args[i] != image || i+2 >= len(args) || args[i+2] != "kproxy" {
			t.Errorf("%q: want the DaemonSet's image %s, a container name, then kproxy", c, image)
			return
		}
		checkKproxyArgs(t, c, args[i+3:])
		hostPaths := map[string]bool{}
		for _, v := range ds.Spec.Template.Spec.Volumes {
			if v.HostPath != nil {
				hostPaths[v.HostPath.Path] = true
			}
		}
		for j, a := range args[:i] {
			if a != "--mount" || j+1 >= i {
				continue
			}
			for _, kv := range strings.Split(args[j+1], ",") {
				if src, ok := strings.CutPrefix(kv, "src="); ok && !hostPaths[src] {
					t.Errorf("%q: mounts %s, which the DaemonSet does not", c, src)
				}
			}
		}
		for p := range hostPaths {
			if !strings.Contains(c, "src="+p+",") {
				t.Errorf("%q: does not mount %s as the DaemonSet does", c, p)
			}
		}
		args = args[:i]
	}
	ctrBin, err := exec.LookPath("ctr")
	if err != nil {
		t.Logf("no ctr in PATH: %q's flags not checked", c)
		return
	}
	help := func(sub ...string) string {
		out, _ := exec.Command(ctrBin, append(slices.Clone(sub), "--help")...).CombinedOutput()
		return string(out)
	}
	global := help()
	subHelp := help(args[sub : sub+1]...)
	if args[sub] == "images" && sub+1 < len(args) {
		subHelp = help(args[sub : sub+2]...)
	}
	for j, a := range args {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, _, _ := strings.Cut(a, "=")
		in := subHelp
		if j < sub {
			in = global
		}
		if !regexp.MustCompile(`(^|[\s,])` + regexp.QuoteMeta(name) + `[\s,=]`).MatchString(in) {
			t.Errorf("%q: %s is not a flag of %s (%s)", c, name, ctrBin, strings.Join(args[:sub+1], " "))
		}
	}
}

// TestDeployDocCommands runs every documented operator command against
// the manifest, offline.
func TestDeployDocCommands(t *testing.T) {
	ds, cm := strictManifest(t)
	seen := map[string]int{}
	for _, doc := range deployDocs {
		for _, c := range docCommands(t, doc.path, doc.section) {
			if strings.Contains(c, "$(") && !strings.HasPrefix(c, "POD=$(") {
				continue
			}
			c = strings.TrimSuffix(strings.TrimPrefix(c, "POD=$("), ")")
			words := argsOf(c)
			switch {
			case words[0] == "kubectl":
				seen["kubectl"]++
				if slices.Contains(words, "patch") {
					seen["patch"]++
				}
				checkKubectl(t, doc.path+": "+c, ds, cm)
			case strings.HasSuffix(words[0], "/ctr") || words[0] == "ctr":
				seen["ctr"]++
				if slices.Contains(words, "--cleanup") {
					seen["cleanup"]++
				}
				checkCtr(t, doc.path+": "+c, ds)
			case words[0] == "kproxy" && len(words) > 1 && strings.HasPrefix(words[1], "--"):
				seen["kproxy"]++
				checkKproxyArgs(t, doc.path+": "+c, words[1:])
			}
		}
	}
	// The checks above found what they are meant to check.
	for _, k := range []string{"kubectl", "patch", "ctr", "cleanup", "kproxy"} {
		if seen[k] == 0 {
			t.Errorf("no documented %s command found in %v", k, deployDocs)
		}
	}
}
