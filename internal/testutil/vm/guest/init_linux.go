package guest

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Paths inside the initramfs: the host's root is mounted on hostDir, bound
// again on newRoot (without what is later mounted over it there), and
// newRoot becomes /. hostDir keeps the unshadowed view the binds come from.
const (
	hostDir = "/host"
	newRoot = "/newroot"
	// wrapperDir (in the guest's /run) holds the modprobe wrapper the kernel
	// runs for autoloads.
	wrapperDir = "/run/kproxy-vm"
)

// Main is the VM's init (pid 1). It never returns: it powers the VM off.
func Main() {
	cfg, err := readConfig()
	if err != nil {
		// No nonce: the host sees no marker and reports the console.
		fmt.Fprintf(os.Stdout, "kproxy-vm init: %v\n", err)
		powerOff()
	}
	code, err := run(cfg)
	if err != nil {
		fmt.Println(ErrorLine(cfg.Nonce, err))
	} else {
		fmt.Println(ExitLine(cfg.Nonce, code))
	}
	powerOff()
}

func readConfig() (*Config, error) {
	b, err := os.ReadFile(ConfigPath)
	if err != nil {
		return nil, err
	}
	cfg := &Config{}
	if err := json.Unmarshal(b, cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", ConfigPath, err)
	}
	if len(cfg.Argv) == 0 {
		return nil, fmt.Errorf("%s: no command", ConfigPath)
	}
	return cfg, nil
}

func (c *Config) debugf(format string, args ...any) {
	if c.Debug {
		fmt.Printf("kproxy-vm init: "+format+"\n", args...)
	}
}

// run prepares the guest and runs the command; it returns the command's
// exit code, or an error when the guest could not be set up.
func run(cfg *Config) (int, error) {
	start := time.Now()
	if err := earlyMounts(); err != nil {
		return 0, err
	}
	for _, ko := range cfg.InitrdModules {
		cfg.debugf("loading %s", ko)
		if err := loadModule(ko); err != nil {
			return 0, err
		}
	}
	if err := mountHost(cfg); err != nil {
		return 0, err
	}
	if err := switchRoot(); err != nil {
		return 0, err
	}
	if err := loadModules(cfg); err != nil {
		return 0, err
	}
	if err := unix.Sethostname([]byte("kproxy-vm")); err != nil {
		return 0, fmt.Errorf("sethostname: %w", err)
	}
	if err := loopbackUp(); err != nil {
		return 0, err
	}
	dir := cfg.Dir
	if fi, err := os.Stat(dir); dir == "" || err != nil || !fi.IsDir() {
		dir = "/"
	}
	cfg.debugf("set up in %v", time.Since(start).Round(time.Millisecond))
	return runCommand(cfg, dir)
}

func mount(src, target, fstype string, flags uintptr, data string) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(src, target, fstype, flags, data); err != nil {
		return fmt.Errorf("mount %s (%s) on %s: %w", src, fstype, target, err)
	}
	return nil
}

// earlyMounts gives the initramfs what module loading and 9p need.
func earlyMounts() error {
	for _, m := range []struct{ src, target, fstype string }{
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
		{"devtmpfs", "/dev", "devtmpfs"},
	} {
		if err := mount(m.src, m.target, m.fstype, 0, ""); err != nil {
			return err
		}
	}
	return nil
}

// loadModule loads one .ko file; a module already there is fine.
func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("loading module: %w", err)
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("loading module %s: %w", path, err)
	}
	return nil
}

// mountHost mounts the host's root read-only, fresh tmpfs on the writable
// directories, the kernel's file systems, and the binds; and installs the
// modprobe wrapper.
func mountHost(cfg *Config) error {
	// cache=loose: the share is read-only and the test's files do not change
	// while the VM runs, so the guest may cache pages and metadata; without
	// it every read of a binary goes to the host.
	opts := "trans=virtio,version=9p2000.L,msize=262144,cache=loose"
	if err := mount(MountTag, hostDir, "9p", unix.MS_RDONLY, opts); err != nil {
		return err
	}
	if err := mount(hostDir, newRoot, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	tmpfs := slices.Clone(cfg.Tmpfs)
	slices.Sort(tmpfs) // parents before children
	var mounted []string
	for _, d := range tmpfs {
		// Only real directories: /var/run is a symlink to /run on most
		// hosts, and mounting through it would resolve against the
		// initramfs' root.
		if fi, err := os.Lstat(hostDir + d); err != nil || !fi.IsDir() {
			cfg.debugf("no tmpfs on %s: not a directory on the host", d)
			continue
		}
		if err := mount("tmpfs", newRoot+d, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
			return err
		}
		mounted = append(mounted, d)
	}
	for _, m := range []struct {
		src, target, fstype string
		flags               uintptr
		data                string
	}{
		{"proc", "/proc", "proc", 0, ""},
		{"sysfs", "/sys", "sysfs", 0, ""},
		{"devtmpfs", "/dev", "devtmpfs", 0, ""},
		{"devpts", "/dev/pts", "devpts", 0, "newinstance,ptmxmode=0666"},
		{"tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
	} {
		if err := mount(m.src, newRoot+m.target, m.fstype, m.flags, m.data); err != nil {
			return err
		}
	}
	for _, p := range cfg.Binds {
		if err := bind(p, mounted); err != nil {
			return err
		}
	}
	return installModprobe(cfg, mounted)
}

// bind makes the host's path p visible at p in the guest when a tmpfs
// hides it; elsewhere the host's root shows it already.
func bind(p string, tmpfs []string) error {
	if !hiddenBy(p, tmpfs) {
		return nil
	}
	src, dst := hostDir+p, newRoot+p
	fi, err := os.Stat(src)
	if err != nil {
		return fmt.Errorf("bind: %w", err)
	}
	if fi.IsDir() {
		err = os.MkdirAll(dst, 0o755)
	} else if err = os.MkdirAll(filepath.Dir(dst), 0o755); err == nil {
		err = os.WriteFile(dst, nil, 0o644)
	}
	if err != nil {
		return fmt.Errorf("bind %s: %w", p, err)
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", p, err)
	}
	return nil
}

// hiddenBy reports whether p lies under one of the tmpfs directories.
func hiddenBy(p string, tmpfs []string) bool {
	for _, d := range tmpfs {
		if p == d || strings.HasPrefix(p, strings.TrimSuffix(d, "/")+"/") {
			return true
		}
	}
	return false
}

// installModprobe points the kernel's autoloader at a wrapper that runs the
// host's modprobe on the guest kernel's module tree: the host has no
// lib/modules/<release> of this kernel (often no /lib/modules at all, so
// nothing can be bound there on a read-only root). Kernel threads share
// pid 1's root, so after the switch the wrapper's path is the guest's.
func installModprobe(cfg *Config, tmpfs []string) error {
	if !hiddenBy(wrapperDir, tmpfs) {
		return fmt.Errorf("no tmpfs on /run for the modprobe wrapper (tmpfs: %v)", tmpfs)
	}
	if strings.ContainsAny(cfg.ModulesRoot, "'\n") {
		return fmt.Errorf("modules root %q: unsupported characters", cfg.ModulesRoot)
	}
	script := "#!/bin/sh\n" +
		"# Kernel module autoloads inside the kproxy test VM.\n" +
		"PATH=/usr/sbin:/sbin:/usr/bin:/bin\n" +
		"exec modprobe -d '" + cfg.ModulesRoot + "' \"$@\"\n"
	if err := os.MkdirAll(newRoot+wrapperDir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(newRoot+wrapperDir+"/modprobe", []byte(script), 0o755); err != nil {
		return err
	}
	return os.WriteFile("/proc/sys/kernel/modprobe", []byte(wrapperDir+"/modprobe\n"), 0o644)
}

// switchRoot makes newRoot the root, as switch_root does: the initramfs
// cannot be pivot_root'ed away, so the new root is moved over / and
// chroot'ed into.
func switchRoot() error {
	if err := os.Chdir(newRoot); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("moving %s to /: %w", newRoot, err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	return os.Chdir("/")
}

// loadModules loads cfg.Modules with their dependencies from the guest
// kernel's tree.
func loadModules(cfg *Config) error {
	if len(cfg.Modules) == 0 {
		return nil
	}
	dir := filepath.Join(cfg.ModulesRoot, "lib/modules", cfg.Release)
	dep, err := os.Open(filepath.Join(dir, "modules.dep"))
	if err != nil {
		return err
	}
	defer dep.Close()
	builtin, err := os.Open(filepath.Join(dir, "modules.builtin"))
	if err != nil {
		return err
	}
	defer builtin.Close()
	mods, err := ParseModules(dep, builtin)
	if err != nil {
		return err
	}
	order, err := mods.Order(cfg.Modules...)
	if err != nil {
		return err
	}
	for _, p := range order {
		cfg.debugf("loading %s", p)
		if err := loadModule(filepath.Join(dir, p)); err != nil {
			return err
		}
	}
	return nil
}

// loopbackUp sets lo up in the VM's root namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	return nil
}

// runCommand runs the command with the console as its output, reaps every
// process (pid 1 inherits orphans), and returns the command's exit code
// (128+signal when killed).
func runCommand(cfg *Config, dir string) (int, error) {
	cmd := exec.Command(cfg.Argv[0], cfg.Argv[1:]...)
	cmd.Env = cfg.Env
	cmd.Dir = dir
	cmd.Stdout = os.Stdout
	cmd.Stderr = os.Stdout
	if !strings.Contains(cfg.Argv[0], "/") {
		// exec.Command looked the name up on the init's PATH.
		for _, kv := range cfg.Env {
			if v, ok := strings.CutPrefix(kv, "PATH="); ok {
				os.Setenv("PATH", v)
			}
		}
		p, err := exec.LookPath(cfg.Argv[0])
		if err != nil {
			return 0, err
		}
		cmd.Path = p
		cmd.Err = nil
	}
	fmt.Println(ReadyLine(cfg.Nonce))
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	pid := cmd.Process.Pid
	for {
		var ws unix.WaitStatus
		wpid, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("wait: %w", err)
		}
		if wpid != pid {
			continue
		}
		code := ws.ExitStatus()
		if ws.Signaled() {
			code = 128 + int(ws.Signal())
		}
		// Whatever the command left behind (daemons of a test) dies now.
		_ = unix.Kill(-1, unix.SIGKILL)
		return code, nil
	}
}

// powerOff waits for the console to drain (the UART sends asynchronously
// and the last lines hold the result) and powers the VM off; the host runs
// qemu with -no-reboot, so a panic ends it as well.
func powerOff() {
	_ = unix.IoctlSetInt(int(os.Stdout.Fd()), unix.TCSBRK, 1) // tcdrain
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	// Not reached unless power-off failed; pid 1 exiting panics the kernel.
	os.Exit(1)
}
