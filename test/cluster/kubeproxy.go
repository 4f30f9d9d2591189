package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kproxy/kproxy/test/e2e/framework"
)

// KubeProxyImage is the name upstream kube-proxy's image is imported under.
const KubeProxyImage = "registry.k8s.io/kube-proxy:v1.37.2"

// BuildKubeProxyImage writes an OCI archive of upstream kube-proxy's
// image to out: kproxy's image (Debian with nft, iptables -legacy/-nft,
// conntrack, ipset, modprobe: what kube-proxy calls too) with
// binDir/kube-proxy added as a second layer, made the entrypoint, and
// named KubeProxyImage in the index as hack/image.sh names kproxy's.
// It needs umoci.
func BuildKubeProxyImage(ctx context.Context, kproxyArchive, binDir, out string) error {
	work, err := os.MkdirTemp("", "kube-proxy-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	layout, bundle := filepath.Join(work, "layout"), filepath.Join(work, "bundle")
	if err := os.Mkdir(layout, 0o755); err != nil {
		return err
	}
	if _, err := framework.RunUntil(ctx, "tar", "-xf", kproxyArchive, "-C", layout); err != nil {
		return err
	}
	// umoci addresses an image by a tag without '/' or ':'; kproxy's
	// index carries its full name.
	if err := nameIndex(filepath.Join(layout, "index.json"), "base"); err != nil {
		return err
	}
	steps := [][]string{
		{"umoci", "unpack", "--image", layout + ":base", bundle},
		{"install", "-m", "0755", filepath.Join(binDir, "kube-proxy"), filepath.Join(bundle, "rootfs", "usr", "local", "bin", "kube-proxy")},
		{"umoci", "repack", "--image", layout + ":kube-proxy", bundle},
		{"umoci", "config", "--image", layout + ":kube-proxy",
			"--config.entrypoint", "/usr/local/bin/kube-proxy",
			"--config.label", "org.opencontainers.image.title=kube-proxy",
			"--config.label", "org.opencontainers.image.description=upstream kube-proxy v1.37.2 on kproxy's image, the control of test/cluster",
			"--config.label", "org.opencontainers.image.ref.name=" + KubeProxyImage},
		{"umoci", "rm", "--image", layout + ":base"},
		{"umoci", "gc", "--layout", layout},
	}
	for _, s := range steps {
		if _, err := framework.RunUntil(ctx, s[0], s[1:]...); err != nil {
			return err
		}
	}
	if err := nameIndex(filepath.Join(layout, "index.json"), KubeProxyImage); err != nil {
		return err
	}
	tmp := out + ".tmp"
	if _, err := framework.RunUntil(ctx, "tar", "-cf", tmp, "-C", layout, "."); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

// nameIndex gives the only manifest of an OCI layout's index the name, in
// both annotations importers read (see hack/image.sh).
func nameIndex(path, name string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var index map[string]any
	if err := json.Unmarshal(b, &index); err != nil {
		return err
	}
	manifests, _ := index["manifests"].([]any)
	if len(manifests) != 1 {
		return fmt.Errorf("%s: %d manifests, want 1", path, len(manifests))
	}
	m, _ := manifests[0].(map[string]any)
	ann, _ := m["annotations"].(map[string]any)
	if ann == nil {
		ann = map[string]any{}
	}
	ann["org.opencontainers.image.ref.name"] = name
	if strings.ContainsAny(name, "/:") {
		ann["io.containerd.image.name"] = name
	} else {
		delete(ann, "io.containerd.image.name")
	}
	m["annotations"] = ann
	b, err = json.Marshal(index)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// backendDir is where, in upstream kube-proxy's container, the iptables
// commands of a forced backend are linked (kubeProxyCommand).
const backendDir = "/run/kube-proxy-iptables"

// kubeProxyCommand is the DaemonSet container's command. With no backend,
// kubeadm's. With one, a shell first links iptables, iptables-save,
// iptables-restore and their ip6tables twins to that backend's commands
// (iptables-legacy, iptables-legacy-save, ...) in backendDir and puts it
// first in PATH: the choice kubeadm's image leaves to its iptables-wrapper,
// which this image (Debian's alternatives, pointing at nft) lacks.
func kubeProxyCommand(backend string) string {
	args := "--config=/var/lib/kube-proxy/config.conf --hostname-override="
	if backend == "" {
		return `            - /usr/local/bin/kube-proxy
            - --config=/var/lib/kube-proxy/config.conf
            - --hostname-override=$(NODE_NAME)
`
	}
	var links []string
	for _, t := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			links = append(links, fmt.Sprintf("ln -sf /usr/sbin/%s-%s%s %s/%s%s", t, backend, suffix, backendDir, t, suffix))
		}
	}
	return fmt.Sprintf(`            - /bin/sh
            - -c
            - mkdir -p %[1]s && %[2]s && PATH=%[1]s:$PATH exec /usr/local/bin/kube-proxy %[3]s"$NODE_NAME"
`, backendDir, strings.Join(links, " && "), args)
}

// kubeProxyManifest is kubeadm's kube-proxy (ServiceAccount, the binding to
// system:node-proxier, the ConfigMap with config.conf and kubeconfig.conf,
// the DaemonSet), for this cluster's API server, cluster CIDR and mode
// (SplitMode's: "iptables-legacy" runs iptables mode on the legacy
// backend, kubeProxyCommand).
func kubeProxyManifest(mode string) (string, error) {
	mode, backend, err := SplitMode(mode)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf(`apiVersion: v1
kind: ServiceAccount
metadata:
  name: kube-proxy
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: kubeadm:node-proxier
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:node-proxier
subjects:
  - kind: ServiceAccount
    name: kube-proxy
    namespace: kube-system
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: kube-proxy
  namespace: kube-system
  labels:
    app: kube-proxy
data:
  config.conf: |
    apiVersion: kubeproxy.config.k8s.io/v1alpha1
    kind: KubeProxyConfiguration
    clientConnection:
      kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
    clusterCIDR: %[1]s
    mode: %[2]s
  kubeconfig.conf: |
    apiVersion: v1
    kind: Config
    clusters:
    - cluster:
        certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
        server: https://%[3]s:%[4]d
      name: default
    contexts:
    - context:
        cluster: default
        namespace: default
        user: default
      name: default
    current-context: default
    users:
    - name: default
      user:
        tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: kube-proxy
  namespace: kube-system
  labels:
    k8s-app: kube-proxy
spec:
  selector:
    matchLabels:
      k8s-app: kube-proxy
  updateStrategy:
    type: RollingUpdate
  template:
    metadata:
      labels:
        k8s-app: kube-proxy
    spec:
      containers:
        - name: kube-proxy
          image: %[5]s
          imagePullPolicy: IfNotPresent
          command:
%[6]s          env:
            - name: NODE_NAME
              valueFrom:
                fieldRef:
                  fieldPath: spec.nodeName
          securityContext:
            privileged: true
          volumeMounts:
            - mountPath: /var/lib/kube-proxy
              name: kube-proxy
            - mountPath: /run/xtables.lock
              name: xtables-lock
            - mountPath: /lib/modules
              name: lib-modules
              readOnly: true
      hostNetwork: true
      priorityClassName: system-node-critical
      serviceAccountName: kube-proxy
      tolerations:
        - operator: Exists
      nodeSelector:
        kubernetes.io/os: linux
      volumes:
        - name: kube-proxy
          configMap:
            name: kube-proxy
        - name: xtables-lock
          hostPath:
            path: /run/xtables.lock
            type: FileOrCreate
        - name: lib-modules
          hostPath:
            path: /lib/modules
`, ClusterCIDR, mode, framework.ControlPlaneIP4, framework.APIServerPort, KubeProxyImage, kubeProxyCommand(backend)), nil
}

// DeployKubeProxy deploys upstream kube-proxy v1.37.2 as kubeadm does, the
// control for kproxy: its image built (BuildKubeProxyImage) and imported
// into every node, kubeadm's manifest applied, the rollout awaited. mode
// is one of SplitMode's.
func (c *Cluster) DeployKubeProxy(ctx context.Context, mode string) error {
	manifest, err := kubeProxyManifest(mode)
	if err != nil {
		return err
	}
	kproxy, err := KproxyArchive()
	if err != nil {
		return err
	}
	archive := filepath.Join(c.Config.VarDir(), "kube-proxy.oci.tar")
	if err := BuildKubeProxyImage(ctx, kproxy, c.Config.BinDir, archive); err != nil {
		return fmt.Errorf("building kube-proxy's image: %w", err)
	}
	for _, n := range c.Nodes {
		if err := ImportImage(ctx, c.Config.BinDir, n.Socket, archive); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	path := filepath.Join(c.Config.VarDir(), "kube-proxy.yaml")
	if err := os.WriteFile(path, []byte(manifest), 0o644); err != nil {
		return err
	}
	if _, err := c.Kubectl(ctx, "apply", "-f", path); err != nil {
		return err
	}
	if err := c.RolloutStatus(ctx, "kube-system", "daemonset/kube-proxy", 5*time.Minute); err != nil {
		return err
	}
	return c.DeployDNS(ctx)
}
