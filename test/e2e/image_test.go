package e2e

// kproxy's container image (hack/image.sh, the Dockerfile's twin) run from
// its own root filesystem: the OCI archive is unpacked, and kproxy runs
// chrooted into it inside node-a's network namespace, with /proc, /sys,
// /dev, /lib/modules and /run/xtables.lock bind-mounted as the DaemonSet
// mounts them, against the framework's API server. In every mode real
// traffic must flow: this proves the image carries every binary and
// library each mode calls (nft, iptables-legacy/-nft-restore, ...).
//
// Addresses: those of env_test.go.

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/test/e2e/framework"
)

const (
	imageScript   = "hack/image.sh"
	imagePackages = "deploy/image-packages.txt"
	// imageName is the repository hack/image.sh names its image and the
	// Dockerfile's documented tag; deploy/kproxy.yaml refers to it.
	imageName = "localhost/kproxy"
	// imageBuildTimeout bounds a build from cold (downloads included).
	imageBuildTimeout = 15 * time.Minute
)

// missingToolLines are what kproxy logs when a binary it calls is missing.
var missingToolLines = []string{
	"Skipped the check for leftover iptables rules",
	"binaries not installed",
	"not found in $PATH",
	"executable file not found",
}

// requiredPackages are the packages every mode needs at run time.
var requiredPackages = []string{"iptables", "nftables", "conntrack", "ipset", "kmod"}

// readPackageList reads deploy/image-packages.txt: one package a line, '#'
// starts a comment.
func readPackageList(t *testing.T, root string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, imagePackages))
	if err != nil {
		t.Fatal(err)
	}
	var pkgs []string
	for _, line := range strings.Split(string(b), "\n") {
		line, _, _ = strings.Cut(line, "#")
		if line = strings.TrimSpace(line); line != "" {
			pkgs = append(pkgs, line)
		}
	}
	return pkgs
}

// kproxyVersion is main.version's default in cmd/kproxy/main.go, the tag
// of the image.
func kproxyVersion(t *testing.T, root string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "cmd/kproxy/main.go"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^var version = "([^"]+)"$`).FindSubmatch(b)
	if m == nil {
		t.Fatal(`cmd/kproxy/main.go has no 'var version = "..."'`)
	}
	return string(m[1])
}

// dockerInstructions splits a Dockerfile into instructions, continuation
// lines joined, comments dropped.
func dockerInstructions(text string) []string {
	var out []string
	cur := ""
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur == "") {
			continue
		}
		if rest, ok := strings.CutSuffix(trimmed, `\`); ok {
			cur += rest + " "
			continue
		}
		cur += trimmed
		if cur != "" {
			out = append(out, cur)
		}
		cur = ""
	}
	return out
}

// sedListRE is how both the Dockerfile and hack/image.sh read the package
// list (comments and blank lines dropped).
var sedListRE = regexp.MustCompile(`sed -e '[^']*' -e '[^']*' (\S*image-packages\.txt|"\$pkgfile")`)

// TestImagePackageListShared: the Dockerfile and hack/image.sh install
// exactly the packages of deploy/image-packages.txt, read the same way,
// and the list has what every mode needs. (That the built image holds
// them is checked by TestImage, from the image's dpkg database.)
func TestImagePackageListShared(t *testing.T) {
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	pkgs := readPackageList(t, root)
	for _, p := range requiredPackages {
		if !slices.Contains(pkgs, p) {
			t.Errorf("%s lacks %s, which a mode calls at run time", imagePackages, p)
		}
	}

	// hack/image.sh's own reading of the list.
	out, err := exec.Command("bash", filepath.Join(root, imageScript), "--packages").Output()
	if err != nil {
		t.Fatalf("%s --packages: %v", imageScript, err)
	}
	if got := strings.Fields(string(out)); !slices.Equal(got, pkgs) {
		t.Errorf("%s --packages = %v, want the list of %s %v", imageScript, got, imagePackages, pkgs)
	}
	script, err := os.ReadFile(filepath.Join(root, imageScript))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^pkgfile=` + regexp.QuoteMeta(imagePackages) + `$`).Match(script) {
		t.Errorf("%s does not read its packages from %s", imageScript, imagePackages)
	}
	if !strings.Contains(string(script), `--include="$(IFS=,; echo "${pkgs[*]}")"`) {
		t.Errorf("%s: mmdebstrap's --include is not the package list", imageScript)
	}
	scriptSed := sedListRE.FindString(string(script))

	// The Dockerfile: every apt-get install reads the list, and names no
	// package of its own.
	df, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	installs := 0
	copied := false
	for _, ins := range dockerInstructions(string(df)) {
		if strings.HasPrefix(ins, "COPY "+imagePackages+" ") {
			copied = true
		}
		for _, cmd := range strings.Split(ins, "&&") {
			_, args, ok := strings.Cut(cmd, "apt-get install")
			if !ok {
				continue
			}
			installs++
			if sed := sedListRE.FindString(ins); sed == "" || !strings.Contains(ins, "| xargs apt-get install") {
				t.Errorf("Dockerfile: %q does not install the list read from %s", cmd, imagePackages)
			} else if scriptSed == "" || !sameSed(sed, scriptSed) {
				t.Errorf("Dockerfile reads the list with %q, %s with %q", sed, imageScript, scriptSed)
			}
			for _, a := range strings.Fields(args) {
				if !strings.HasPrefix(a, "-") {
					t.Errorf("Dockerfile: apt-get install names %q itself; list packages in %s", a, imagePackages)
				}
			}
		}
	}
	if !copied {
		t.Errorf("Dockerfile does not COPY %s", imagePackages)
	}
	if installs == 0 {
		t.Error("Dockerfile installs no package")
	}
}

// sameSed compares two sed commands reading the list, file paths aside.
func sameSed(a, b string) bool {
	fa, fb := strings.Fields(a), strings.Fields(b)
	return len(fa) == len(fb) && slices.Equal(fa[:len(fa)-1], fb[:len(fb)-1])
}

// TestDeployImage: the DaemonSet runs the image hack/image.sh and the
// Dockerfile's documented tag produce, for the version kproxy reports.
func TestDeployImage(t *testing.T) {
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	deployObject(t, loadDeployObjects(t), "DaemonSet", deployName, &ds)
	want := imageName + ":" + kproxyVersion(t, root)
	if got := ds.Spec.Template.Spec.Containers[0].Image; got != want {
		t.Errorf("DaemonSet image = %q, want %q (what hack/image.sh builds)", got, want)
	}
	if p := ds.Spec.Template.Spec.Containers[0].ImagePullPolicy; p != corev1.PullIfNotPresent {
		t.Errorf("imagePullPolicy = %q, want IfNotPresent (the image is loaded on the node, not pulled)", p)
	}
	df, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(df), "build -t "+want+" ") {
		t.Errorf("Dockerfile does not document building %s", want)
	}
}

// ---- the OCI archive ----

// ociDescriptor, ociIndex, ociManifest and ociConfig are the parts of the
// OCI image spec the test reads.
type ociDescriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations"`
}

type ociIndex struct {
	Manifests []ociDescriptor `json:"manifests"`
}

type ociManifest struct {
	Config ociDescriptor   `json:"config"`
	Layers []ociDescriptor `json:"layers"`
}

type ociConfig struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Config       struct {
		Entrypoint []string          `json:"Entrypoint"`
		Cmd        []string          `json:"Cmd"`
		Env        []string          `json:"Env"`
		Labels     map[string]string `json:"Labels"`
	} `json:"config"`
}

// unpackedImage is an image's root filesystem and configuration.
type unpackedImage struct {
	rootfs string
	config ociConfig
	ref    string
}

// imageArchive returns the OCI archive of the current source state,
// building it with hack/image.sh when missing. A failed build skips the
// test, or fails it under KPROXY_E2E=1.
func imageArchive(t *testing.T) string {
	t.Helper()
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(root, imageScript)
	out, err := exec.Command(script, "--print-archive").Output()
	if err != nil {
		t.Fatalf("%s --print-archive: %v", imageScript, err)
	}
	path := strings.TrimSpace(string(out))
	if _, err := os.Stat(path); err == nil {
		return path
	}
	t.Logf("%s missing: building it with %s", path, imageScript)
	ctx, cancel := context.WithTimeout(context.Background(), imageBuildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, script)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	start := time.Now()
	if err := cmd.Run(); err != nil {
		msg := fmt.Sprintf("%s: %v\n%s", imageScript, err, log.String())
		if framework.Mandatory() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	t.Logf("%s built the image in %s", imageScript, time.Since(start).Round(time.Second))
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("%s succeeded but wrote no %s:\n%s", imageScript, path, log.String())
	}
	return path
}

// unpackImage unpacks the OCI archive's one image into dir/rootfs: the
// layout is read with archive/tar, every blob's digest checked, and the
// layers applied in order with tar (as root, so owners, modes and device
// nodes are kept).
func unpackImage(t *testing.T, archive, dir string) *unpackedImage {
	t.Helper()
	blobs := map[string][]byte{}
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	var indexJSON []byte
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", archive, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("%s: %s: %v", archive, h.Name, err)
		}
		name := strings.TrimPrefix(h.Name, "./")
		switch {
		case name == "index.json":
			indexJSON = b
		case strings.HasPrefix(name, "blobs/sha256/"):
			d := strings.TrimPrefix(name, "blobs/sha256/")
			if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != d {
				t.Fatalf("%s: blob %s has digest sha256:%x", archive, d, sum)
			}
			blobs["sha256:"+d] = b
		}
	}
	blob := func(d ociDescriptor, into any) []byte {
		t.Helper()
		b, ok := blobs[d.Digest]
		if !ok {
			t.Fatalf("%s: no blob %s (%s)", archive, d.Digest, d.MediaType)
		}
		if into != nil {
			if err := json.Unmarshal(b, into); err != nil {
				t.Fatalf("%s: %s: %v", archive, d.Digest, err)
			}
		}
		return b
	}
	var idx ociIndex
	if err := json.Unmarshal(indexJSON, &idx); err != nil {
		t.Fatalf("%s: index.json: %v", archive, err)
	}
	if len(idx.Manifests) != 1 {
		t.Fatalf("%s: %d manifests, want 1", archive, len(idx.Manifests))
	}
	img := &unpackedImage{rootfs: filepath.Join(dir, "rootfs"), ref: idx.Manifests[0].Annotations["org.opencontainers.image.ref.name"]}
	var m ociManifest
	blob(idx.Manifests[0], &m)
	blob(m.Config, &img.config)
	if err := os.Mkdir(img.rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, l := range m.Layers {
		if l.MediaType != "application/vnd.oci.image.layer.v1.tar+gzip" {
			t.Fatalf("%s: layer %s of type %s", archive, l.Digest, l.MediaType)
		}
		cmd := exec.Command("tar", "-xz", "--numeric-owner", "-C", img.rootfs)
		cmd.Stdin = bytes.NewReader(blob(l, nil))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("unpacking layer %s: %v\n%s", l.Digest, err, out)
		}
	}
	return img
}

// mountsUnder lists the mount points at or below dir in this mount
// namespace.
func mountsUnder(dir string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return out, nil
}

// launcher runs the image's entrypoint chrooted into its root filesystem:
// `ip netns exec` (framework.StartProcess) → unshare a mount namespace
// (slave: nothing mounted here reaches the host, and it all goes when
// kproxy exits) → mount what the DaemonSet mounts → env with exactly the
// image's environment plus the mode's → chroot → the entrypoint. Every step
// execs in place, so the process the test signals is kproxy. The control
// plane's directory (kubeconfig) is mounted at the same path.
func (img *unpackedImage) launcher(t *testing.T, cp *framework.ControlPlane) func(env, flags []string) []string {
	return func(env, flags []string) []string {
		r := img.rootfs
		script := strings.Join([]string{
			"set -e",
			`R=$1 CP=$2`,
			`mount --rbind /proc "$R/proc"`,
			`mount --rbind /sys "$R/sys"`,
			`mount --rbind /dev "$R/dev"`,
			`mkdir -p "$R/lib/modules" "$R/run" "$R$CP"`,
			// Real nodes have it; a CI host running a container's
			// kernel may not (its modules are then built in or loaded).
			`if [ -d /lib/modules ]; then mount --rbind -o ro /lib/modules "$R/lib/modules"; fi`,
			// The DaemonSet's hostPath is FileOrCreate.
			`[ -e /run/xtables.lock ] || : >/run/xtables.lock`,
			`touch "$R/run/xtables.lock"`,
			`mount --bind /run/xtables.lock "$R/run/xtables.lock"`,
			`mount --bind "$CP" "$R$CP"`,
			`shift 2`,
			`exec "$@"`,
		}, "\n")
		argv := []string{"unshare", "--mount", "--propagation", "slave", "sh", "-c", script, "sh", r, cp.Dir,
			"env", "-i"}
		argv = append(argv, img.config.Config.Env...)
		argv = append(argv, env...)
		argv = append(argv, "chroot", r)
		argv = append(argv, img.config.Config.Entrypoint...)
		return append(argv, flags...)
	}
}

// TestImage runs kproxy from the image in every mode.
func TestImage(t *testing.T) {
	if reason := framework.SkipReason(); reason != "" {
		t.Skip(reason)
	}
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	archive := imageArchive(t)
	if fi, err := os.Stat(archive); err == nil {
		t.Logf("image archive %s: %.1f MB", filepath.Base(archive), float64(fi.Size())/1e6)
	}

	// The root filesystem is removed only when nothing is mounted in it:
	// a leaked bind mount of /dev or /sys must not be deleted through.
	dir, err := os.MkdirTemp("", "kproxy-image-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if m, err := mountsUnder(dir); err != nil || len(m) > 0 {
			t.Errorf("not removing %s: mounts %v left under it (%v)", dir, m, err)
			return
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("removing %s: %v", dir, err)
		}
	})
	img := unpackImage(t, archive, dir)

	version := kproxyVersion(t, root)
	if want := imageName + ":" + version; img.ref != want {
		t.Errorf("image reference %q, want %q", img.ref, want)
	}
	labels := img.config.Config.Labels
	if got := labels["org.opencontainers.image.version"]; got != version {
		t.Errorf("label org.opencontainers.image.version = %q, want %q", got, version)
	}
	if got := labels["org.opencontainers.image.ref.name"]; got != imageName+":"+version {
		t.Errorf("label org.opencontainers.image.ref.name = %q, want %s:%s", got, imageName, version)
	}
	if ep := img.config.Config.Entrypoint; !slices.Equal(ep, []string{"/usr/local/bin/kproxy"}) {
		t.Fatalf("entrypoint %v, want [/usr/local/bin/kproxy]", ep)
	}
	// Every listed package is installed (the image's dpkg database).
	status, err := os.ReadFile(filepath.Join(img.rootfs, "var/lib/dpkg/status"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range readPackageList(t, root) {
		if !regexp.MustCompile(`(?m)^Package: ` + regexp.QuoteMeta(p) + `\nStatus: install ok installed$`).Match(status) {
			t.Errorf("package %s of %s is not installed in the image", p, imagePackages)
		}
	}
	// The binary reports the version, from inside the image.
	out, err := exec.Command("chroot", img.rootfs, "/usr/local/bin/kproxy", "version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), version) {
		t.Errorf("kproxy version in the image: %v: %s (want %s)", err, out, version)
	}
	if t.Failed() {
		return
	}

	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			cp := sharedControlPlane(t)
			e := newEnvLaunch(t, cp, mode, img.launcher(t, cp))
			// kproxy really runs in the image's root filesystem.
			if got, err := os.Readlink(fmt.Sprintf("/proc/%d/root", e.kproxy.Pid())); err != nil || got != img.rootfs {
				t.Fatalf("kproxy's root is %q (%v), want the image's %s", got, err, img.rootfs)
			}
			svc := e.createService("web", func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeNodePort
				s.Spec.Ports = []corev1.ServicePort{portTCP, portUDP}
				s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyPreferDualStack)
			})
			e.setEndpoints("web", ipv4, endpoint{pod: podA1}, endpoint{pod: podB1})
			e.setEndpoints("web", ipv6, endpoint{pod: podA2})
			cip := clusterIP(svc, v4)
			e.expectServers(client, "tcp", ap(cip, 80), podA1, podB1)
			e.expectServers(client, "udp", ap(cip, 53), podA1, podB1)
			e.expectServers(testerA, "tcp", ap(cip, 80), podA1, podB1)
			e.expectServers(client, "tcp", ap(nodeAIP, int(svc.Spec.Ports[0].NodePort)), podA1, podB1)
			if cip6 := clusterIP(svc, v6); cip6.IsValid() {
				e.expectServers(client, "tcp", ap(cip6, 80), podA2)
			} else {
				t.Error("the Service got no IPv6 cluster IP")
			}
			// A change is applied too (a partial sync through the image's tools).
			e.setEndpoints("web", ipv4, endpoint{pod: podA2})
			e.expectServers(client, "tcp", ap(cip, 80), podA2)
			// Nothing kproxy looked for was missing: in nftables mode a
			// missing iptables binary only skips the leftover check, with
			// a log line (kproxy runs with --v=2).
			log := e.kproxyLog()
			var found []string
			for _, bad := range missingToolLines {
				if strings.Contains(log, bad) {
					found = append(found, bad)
				}
			}
			if len(found) > 0 {
				t.Errorf("kproxy in the image misses a tool: its log says %q:\n%s", found, log)
			}
		})
	}
}

// readArchiveIndex reads index.json of an OCI archive.
func readArchiveIndex(t *testing.T, archive string) ociIndex {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			t.Fatalf("%s has no index.json", archive)
		} else if err != nil {
			t.Fatalf("%s: %v", archive, err)
		}
		if strings.TrimPrefix(h.Name, "./") != "index.json" {
			continue
		}
		var idx ociIndex
		if err := json.NewDecoder(tr).Decode(&idx); err != nil {
			t.Fatalf("%s: index.json: %v", archive, err)
		}
		return idx
	}
}

// imageNameAnnotations are the annotations of an index entry that image
// importers take the image's name from: containerd's importer (ctr images
// import) and podman's libimage read io.containerd.image.name first,
// containers/image and skopeo org.opencontainers.image.ref.name.
var imageNameAnnotations = []string{"io.containerd.image.name", "org.opencontainers.image.ref.name"}

// TestImageArchiveName: the archive's index names its one image with the
// DaemonSet's full image name, so importing it needs no retagging.
func TestImageArchiveName(t *testing.T) {
	var ds appsv1.DaemonSet
	deployObject(t, loadDeployObjects(t), "DaemonSet", deployName, &ds)
	want := ds.Spec.Template.Spec.Containers[0].Image
	idx := readArchiveIndex(t, imageArchive(t))
	if len(idx.Manifests) != 1 {
		t.Fatalf("index has %d manifests, want 1", len(idx.Manifests))
	}
	for _, a := range imageNameAnnotations {
		if got := idx.Manifests[0].Annotations[a]; got != want {
			t.Errorf("index annotation %s = %q, want the DaemonSet's image %q", a, got, want)
		}
	}
}

// TestImageContainerdImport imports the archive with Debian's containerd
// and ctr, as docs/rke2.md tells an operator to (no --base-name, no
// retagging), into a containerd of the test's own (root, state and socket
// in a temporary directory), and expects it listed under the DaemonSet's
// image name.
func TestImageContainerdImport(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("containerd needs root")
	}
	bins := map[string]string{}
	for _, b := range []string{"containerd", "ctr"} {
		p, err := exec.LookPath(b)
		if err != nil {
			msg := fmt.Sprintf("no %s in PATH (Debian's containerd package; hack/test.sh installs it)", b)
			if framework.Mandatory() {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
		bins[b] = p
	}
	var ds appsv1.DaemonSet
	deployObject(t, loadDeployObjects(t), "DaemonSet", deployName, &ds)
	want := ds.Spec.Template.Spec.Containers[0].Image
	archive := imageArchive(t)

	dir, err := os.MkdirTemp("", "kproxy-containerd-")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "containerd.sock")
	cfg := filepath.Join(dir, "config.toml")
	// Only what importing needs: no CRI plugin (it would start a CNI and
	// stream server of its own), no snapshotter but overlayfs and native.
	conf := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = %q
[ttrpc]
  address = %q
[debug]
  address = %q
[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, sock+".ttrpc", filepath.Join(dir, "debug.sock"), filepath.Join(dir, "opt"))
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	var daemonLog bytes.Buffer
	d := exec.Command(bins["containerd"], "--config", cfg)
	d.Stdout, d.Stderr = &daemonLog, &daemonLog
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- d.Wait() }()
	t.Cleanup(func() {
		// Stopped by its PID; then nothing may stay mounted under dir
		// (an unpacked layer) before the directory goes.
		_ = d.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = d.Process.Kill()
			<-exited
		}
		if m, err := mountsUnder(dir); err != nil || len(m) > 0 {
			for i := len(m) - 1; i >= 0; i-- {
				_ = exec.Command("umount", m[i]).Run()
			}
			if m, err := mountsUnder(dir); err != nil || len(m) > 0 {
				t.Errorf("not removing %s: mounts %v left under it (%v)", dir, m, err)
				return
			}
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("removing %s: %v", dir, err)
		}
	})
	ctr := func(args ...string) (string, error) {
		out, err := exec.Command(bins["ctr"], append([]string{"--address", sock, "-n", "k8s.io"}, args...)...).CombinedOutput()
		return string(out), err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := ctr("version"); err == nil {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("containerd exited: %v\n%s", err, daemonLog.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd not answering on %s after 30s:\n%s", sock, daemonLog.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	if out, err := ctr("images", "import", archive); err != nil {
		t.Fatalf("ctr images import: %v\n%s\ncontainerd:\n%s", err, out, daemonLog.String())
	}
	out, err := ctr("images", "ls", "-q")
	if err != nil {
		t.Fatalf("ctr images ls: %v\n%s", err, out)
	}
	if names := strings.Fields(out); !slices.Equal(names, []string{want}) {
		t.Errorf("containerd lists %v after the import, want exactly [%s]", names, want)
	}
}
