package cluster

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kproxy/kproxy/test/e2e/framework"
)

// TestSweep: what a cluster whose owner was killed leaves (a pod's process
// in its cgroup, a "kubelet" naming the cluster's directory, a tmpfs the
// kubelet mounted, a node's network namespace, a log link) is gone after
// Sweep, run as hack/cluster.sh down runs it: from another process, with
// only state.json to go by. A live owner's cluster is refused.
func TestSweep(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (cgroups, mounts, network namespaces)")
	}
	cfg := Config{Name: "kproxy-cluster-sweep-test", BinDir: "/nonexistent", ImagesDir: "/nonexistent"}
	if err := cfg.defaults(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Sweep(cfg) })
	node := filepath.Join(cfg.VarDir(), "node1")
	mnt := filepath.Join(node, "kubelet", "pods", "x", "volumes", "token")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(cfg.RunDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	// A "kubelet": sleep under that name, its argument in the cluster's
	// directory.
	kubelet := filepath.Join(t.TempDir(), "kubelet")
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(sleep); err != nil || os.WriteFile(kubelet, b, 0o755) != nil {
		t.Fatalf("copying sleep: %v", err)
	}
	kcmd := exec.Command(kubelet, "600", "--root-dir="+node)
	if err := kcmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = kcmd.Wait() }()
	// A "pod": a process in the node's cgroup (pids hierarchy).
	pod := exec.Command("sleep", "600")
	if err := pod.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = pod.Wait() }()
	cg := filepath.Join(cgroupFS, "pids", cfg.cgroupRoot("node1"), "pod1")
	if err := os.MkdirAll(cg, 0o755); err != nil {
		t.Skipf("no pids cgroup hierarchy: %v", err)
	}
	if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(pod.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	ns := "kpe2e-sweeptest-" + strconv.Itoa(os.Getpid())
	if _, err := framework.Run(context.Background(), "ip", "netns", "add", ns); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join("/var/log/containers", "sweeptest_"+strconv.Itoa(os.Getpid())+".log")
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(node, "pod-logs", "x.log"), link); err != nil {
		t.Fatal(err)
	}

	// Owned by a live process: refused, nothing touched.
	if err := writeState(cfg, state{Owner: os.Getppid(), OwnerStart: processStart(os.Getppid()), Namespaces: []string{ns}}); err != nil {
		t.Fatal(err)
	}
	if err := Sweep(cfg); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("Sweep of a cluster whose owner runs: %v, want refused", err)
	}
	if !alive(pod.Process.Pid) {
		t.Fatalf("the refused Sweep killed a pod")
	}
	// Its owner gone (a start time no process has).
	if err := writeState(cfg, state{Owner: os.Getppid(), OwnerStart: "0", Namespaces: []string{ns}}); err != nil {
		t.Fatal(err)
	}
	if err := Sweep(cfg); err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for (alive(pod.Process.Pid) || alive(kcmd.Process.Pid)) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if alive(pod.Process.Pid) {
		t.Errorf("the pod's process still runs")
	}
	if alive(kcmd.Process.Pid) {
		t.Errorf("the kubelet still runs")
	}
	if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), cfg.VarDir()) {
		t.Errorf("a mount under %s is left", cfg.VarDir())
	}
	for _, p := range []string{cfg.VarDir(), cfg.RunDir(), filepath.Join("/run/netns", ns), link,
		filepath.Join(cgroupFS, "pids", "/"+cfg.Name)} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s is left", p)
		}
	}
}

func TestUnescapeMount(t *testing.T) {
	if got := unescapeMount(`/var/lib/a\040b\011c`); got != "/var/lib/a b\tc" {
		t.Errorf("got %q", got)
	}
}
