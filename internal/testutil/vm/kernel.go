package vm

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/testutil/vm/guest"
)

// DefaultCacheDir is where test/vm/prepare.sh keeps the guest kernel:
// <DefaultCacheDir>/<release>/{vmlinuz,lib/modules/<release>/...} and a
// symlink "current" to the release in use.
const DefaultCacheDir = "/var/cache/kproxy-vm"

// Environment variables.
const (
	// EnvCacheDir moves DefaultCacheDir, as it does for
	// test/vm/prepare.sh.
	EnvCacheDir = "KPROXY_VM_CACHE"
	// EnvKernelDir overrides <cache dir>/current.
	EnvKernelDir = "KPROXY_VM_KERNEL_DIR"
	// EnvAccel forces "kvm" or "tcg".
	EnvAccel = "KPROXY_VM_ACCEL"
	// EnvRequired ("1", set by CI) turns "no VM here" into a failure for
	// tests that need one.
	EnvRequired = "KPROXY_VM"
	// EnvInVM ("1") is set for commands run by RunTestInVM.
	EnvInVM = "KPROXY_IN_VM"
	// EnvDebug ("1") shows the kernel's messages and the init's steps.
	EnvDebug = "KPROXY_VM_DEBUG"
)

// qemuBinary is the x86-64 system emulator (Debian package qemu-system-x86).
const qemuBinary = "qemu-system-x86_64"

// Kernel is a prepared guest kernel.
type Kernel struct {
	// Dir holds vmlinuz and lib/modules/<Release>.
	Dir     string
	Image   string
	Release string
}

// ModulesDir is lib/modules/<release> of the kernel.
func (k *Kernel) ModulesDir() string { return filepath.Join(k.Dir, "lib/modules", k.Release) }

// FindKernel locates the kernel prepared by test/vm/prepare.sh.
func FindKernel() (*Kernel, error) {
	dir := os.Getenv(EnvKernelDir)
	if dir == "" {
		cache := os.Getenv(EnvCacheDir)
		if cache == "" {
			cache = DefaultCacheDir
		}
		dir = filepath.Join(cache, "current")
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, fmt.Errorf("no test kernel (run test/vm/prepare.sh): %w", err)
	}
	k := &Kernel{Dir: real, Image: filepath.Join(real, "vmlinuz")}
	if _, err := os.Stat(k.Image); err != nil {
		return nil, fmt.Errorf("test kernel incomplete (run test/vm/prepare.sh): %w", err)
	}
	entries, err := os.ReadDir(filepath.Join(real, "lib/modules"))
	if err != nil {
		return nil, fmt.Errorf("test kernel incomplete (run test/vm/prepare.sh): %w", err)
	}
	if len(entries) != 1 {
		return nil, fmt.Errorf("test kernel %s: want one release in lib/modules, found %d", real, len(entries))
	}
	k.Release = entries[0].Name()
	if _, err := os.Stat(filepath.Join(k.ModulesDir(), "modules.dep")); err != nil {
		return nil, fmt.Errorf("test kernel incomplete, no depmod output (run test/vm/prepare.sh): %w", err)
	}
	return k, nil
}

// Modules reads the kernel's module index.
func (k *Kernel) Modules() (*guest.Modules, error) {
	dep, err := os.Open(filepath.Join(k.ModulesDir(), "modules.dep"))
	if err != nil {
		return nil, err
	}
	defer dep.Close()
	builtin, err := os.Open(filepath.Join(k.ModulesDir(), "modules.builtin"))
	if err != nil {
		return nil, err
	}
	defer builtin.Close()
	return guest.ParseModules(dep, builtin)
}

// Accel returns the accelerator qemu will use: "kvm" when /dev/kvm answers,
// else "tcg" (emulation: the same, many times slower). EnvAccel overrides.
func Accel() string {
	switch a := os.Getenv(EnvAccel); a {
	case "kvm", "tcg":
		return a
	}
	if kvmUsable() == nil {
		return "kvm"
	}
	return "tcg"
}

// kvmUsable says why KVM cannot run a stock kernel here (nil when it can).
// A /dev/kvm that answers is not enough: on a host that is itself a VM
// without nested hardware virtualization, /dev/kvm can be PVM (kvm_pvm),
// which runs only kernels built as PVM guests; a stock kernel hangs right
// after its real-mode setup. Stock guests need the CPU's VMX or SVM.
func kvmUsable() error {
	cpuinfo, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return err
	}
	if !hasHardwareVirt(string(cpuinfo)) {
		return errors.New("the CPU shows no vmx or svm flag (no nested virtualization)")
	}
	fd, err := unix.Open("/dev/kvm", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	const kvmGetAPIVersion = 0xAE00 // _IO(KVMIO, 0x00)
	v, err := unix.IoctlRetInt(fd, kvmGetAPIVersion)
	if err != nil {
		return err
	}
	if v != 12 { // the stable API since Linux 2.6.22
		return fmt.Errorf("KVM API version %d", v)
	}
	return nil
}

// hasHardwareVirt looks for the vmx (Intel) or svm (AMD) flag in
// /proc/cpuinfo's text.
func hasHardwareVirt(cpuinfo string) bool {
	for _, line := range strings.Split(cpuinfo, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(k) != "flags" {
			continue
		}
		for _, f := range strings.Fields(v) {
			if f == "vmx" || f == "svm" {
				return true
			}
		}
		return false
	}
	return false
}

// InVM reports whether this process runs inside the test VM.
func InVM() bool { return os.Getenv(EnvInVM) == "1" }

// Required reports whether tests must not skip for want of a VM (CI).
func Required() bool { return os.Getenv(EnvRequired) == "1" }

// Available reports whether a VM can be started here; if not, why.
func Available() (ok bool, why string) {
	if err := available(); err != nil {
		return false, err.Error()
	}
	return true, ""
}

func available() error {
	if InVM() {
		return errors.New("already inside the test VM")
	}
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		return fmt.Errorf("the test VM runs on linux/amd64 hosts only, not %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	if _, err := exec.LookPath(qemuBinary); err != nil {
		return fmt.Errorf("%s not found (Debian package qemu-system-x86; test/vm/prepare.sh installs it)", qemuBinary)
	}
	if _, err := exec.LookPath("go"); err != nil {
		return errors.New("go not found: the VM's init is built at test time")
	}
	if _, err := FindKernel(); err != nil {
		return err
	}
	return nil
}

// moduleRoot is the directory of the main module of the working directory.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("not inside a Go module")
	}
	return filepath.Dir(gomod), nil
}
