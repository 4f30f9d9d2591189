package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/test/e2e/framework"
)

// cgroupFS is where the host mounts its cgroup hierarchies.
const cgroupFS = "/sys/fs/cgroup"

// killTimeout bounds waiting for killed processes to disappear.
const killTimeout = 30 * time.Second

// Sweep removes everything a cluster named by cfg left on the machine,
// whatever process made it: processes (the pods' by cgroup; kubelets,
// containerd and its shims by the cluster's paths on their command line),
// mounts under the cluster's directories, the network namespaces
// state.json names, the pods' cgroups, the kubelets' log links in
// /var/log/containers, and the directories. A cluster whose owner still
// runs is the owner's to stop: Sweep refuses it.
func Sweep(cfg Config) error {
	if err := cfg.defaults(); err != nil {
		return err
	}
	if pid := OwnerAlive(cfg); pid != 0 && pid != os.Getpid() {
		return fmt.Errorf("cluster %s is in use by process %d", cfg.Name, pid)
	}
	st, _ := readState(cfg) // none: nothing of it to remove
	var errs []error
	errs = append(errs, killCgroupTree("/"+cfg.Name))
	errs = append(errs, killProcesses(func(argv []string) bool {
		return nodeProgram(argv) && (mentions(argv, cfg.VarDir()) || mentions(argv, cfg.RunDir()))
	}))
	errs = append(errs, unmountUnder(cfg.VarDir(), cfg.RunDir()))
	for _, ns := range st.Namespaces {
		if _, err := os.Stat(filepath.Join("/run/netns", ns)); err == nil {
			if _, err := framework.Run(context.Background(), "ip", "netns", "delete", ns); err != nil {
				errs = append(errs, err)
			}
		}
	}
	errs = append(errs, removeCgroups("/"+cfg.Name))
	errs = append(errs, removeLogLinks("/var/log/containers", cfg.VarDir()))
	for _, d := range []string{cfg.VarDir(), cfg.RunDir()} {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// mentions reports whether an argument of argv names dir or a path in it.
func mentions(argv []string, dir string) bool {
	for _, a := range argv {
		if strings.Contains(a+"/", dir+"/") {
			return true
		}
	}
	return false
}

// nodeProgram reports whether argv runs one of the programs a node starts
// outside its pods' cgroups: the kubelet, containerd, a containerd shim.
func nodeProgram(argv []string) bool {
	switch filepath.Base(argv[0]) {
	case "kubelet", "containerd", "containerd-shim-runc-v2":
		return true
	}
	return false
}

// killNode kills node's pods (every process in its cgroups) and the
// containerd shims serving its socket.
func killNode(cfg Config, node, socket string) error {
	return errors.Join(
		killCgroupTree(cfg.cgroupRoot(node)),
		killProcesses(func(argv []string) bool { return nodeProgram(argv) && mentions(argv, socket) }),
	)
}

// killProcesses SIGKILLs every process (but this one) whose command line
// match accepts, and waits until they are gone.
func killProcesses(match func(argv []string) bool) error {
	var pids []int
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		if match(strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")) {
			pids = append(pids, pid)
		}
	}
	return killAndWait(pids)
}

// killAndWait SIGKILLs pids and waits until none exists (as a zombie
// reaped by its parent, or not at all).
func killAndWait(pids []int) error {
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(killTimeout)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				return fmt.Errorf("process %d still runs %s after SIGKILL", pid, killTimeout)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}

// hierarchies are the cgroup hierarchies mounted under cgroupFS (cgroup v1
// controllers, named hierarchies, the unified one); symbolic links such as
// cpu,cpuacct's aliases are skipped.
func hierarchies() []string {
	entries, err := os.ReadDir(cgroupFS)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && e.Type()&os.ModeSymlink == 0 {
			out = append(out, filepath.Join(cgroupFS, e.Name()))
		}
	}
	return out
}

// cgroupTree lists the cgroup directories at and below rel in hierarchy h,
// deepest first.
func cgroupTree(h, rel string) []string {
	var dirs []string
	_ = filepath.WalkDir(filepath.Join(h, rel), func(path string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	return dirs
}

// killCgroupTree kills every process in the cgroups at and below rel, in
// every hierarchy (a process may be in one and not another), until none
// is left.
func killCgroupTree(rel string) error {
	deadline := time.Now().Add(killTimeout)
	for {
		var pids []int
		for _, h := range hierarchies() {
			for _, d := range cgroupTree(h, rel) {
				b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
				if err != nil {
					continue
				}
				for _, f := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() && alive(pid) {
						pids = append(pids, pid)
					}
				}
			}
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v still in cgroup %s after SIGKILL", pids, rel)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// removeCgroups removes the (empty) cgroups at and below rel in every
// hierarchy.
func removeCgroups(rel string) error {
	var errs []error
	for _, h := range hierarchies() {
		for _, d := range cgroupTree(h, rel) {
			if err := unix.Rmdir(d); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("removing cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// unmountUnder unmounts every mount at or below the directories, deepest
// first (lazily: a mount still busy goes once unused).
func unmountUnder(dirs ...string) error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		for _, d := range dirs {
			if mp == d || strings.HasPrefix(mp, d+"/") {
				points = append(points, mp)
				break
			}
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	var errs []error
	for _, mp := range points {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", mp, err))
		}
	}
	return errors.Join(errs...)
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space, ...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var out strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				out.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		out.WriteByte(s[i])
	}
	return out.String()
}

// removeLogLinks removes the symbolic links in dir that point into target
// (the kubelet links every container's log into /var/log/containers).
func removeLogLinks(dir, target string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil // no such directory: nothing linked
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		dst, err := os.Readlink(p)
		if err == nil && strings.HasPrefix(dst, target+"/") {
			if err := os.Remove(p); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
