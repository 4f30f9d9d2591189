package vm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/testutil/vm/guest"
)

// Defaults of Config.
const (
	DefaultMemoryMiB = 1536
	DefaultCPUs      = 2
	// DefaultTimeout bounds a whole run: boot, command, power-off.
	DefaultTimeout = 10 * time.Minute
)

// DefaultTmpfs are the host directories the guest gets fresh and writable.
var DefaultTmpfs = []string{"/tmp", "/run", "/var/run", "/var/tmp"}

// initrdModules are what the init needs before the host's root is there:
// the virtio PCI transport and the 9p file system over it. Dependencies are
// added from modules.dep.
var initrdModules = []string{"virtio_pci", "9pnet_virtio", "9p"}

// initPackage is the VM's init, built (static) at run time.
const initPackage = "github.com/kproxy/kproxy/internal/testutil/vm/guest/init"

// consoleTailLines is how much of the console an error shows.
const consoleTailLines = 40

// Config is one command to run in a fresh VM.
type Config struct {
	// Argv is the command; a name without '/' is looked up on Env's PATH.
	Argv []string
	// Env is the command's whole environment.
	Env []string
	// Dir is the working directory (a host path, seen read-only); "" or a
	// path the guest lacks means /.
	Dir string
	// Binds are host paths under a tmpfs directory of the guest (the test
	// binary in /tmp, say) to keep visible there, read-only. Symlinks are
	// resolved on the host.
	Binds []string
	// Modules are loaded with their dependencies before the command, for
	// what the kernel does not load on demand (br_netfilter).
	Modules []string
	// MemoryMiB and CPUs size the VM (defaults 1536 MiB, 2 CPUs, at most
	// the host's).
	MemoryMiB int
	CPUs      int
	// BootTimeout bounds the time until the command starts (default 1
	// minute with KVM, 5 without); Timeout the whole run (DefaultTimeout).
	BootTimeout time.Duration
	Timeout     time.Duration
	// Output receives the command's output, line by line, as it comes. Nil
	// discards it.
	Output func(line string)
	// Debug shows the kernel's messages and the init's steps (also with
	// KPROXY_VM_DEBUG=1).
	Debug bool
}

// Result is how a VM run ended.
type Result struct {
	// ExitCode is the command's (128+signal if it was killed).
	ExitCode int
	Accel    string
	// Boot is the time from starting qemu to the command's start; Total
	// until qemu exited.
	Boot, Total time.Duration
	// Console is what the VM printed that was not the command's output
	// (boot messages).
	Console []string
}

// Run boots a VM on the prepared kernel with the host's root file system
// mounted read-only, runs cfg.Argv in it as root, and returns its exit code.
// The error is for the VM itself (no kernel, boot timeout, init failure);
// a command failing is a non-zero ExitCode. qemu is always killed before
// Run returns, and its temporary files removed.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if len(cfg.Argv) == 0 {
		return nil, errors.New("vm.Run: no command")
	}
	if err := available(); err != nil {
		return nil, err
	}
	k, err := FindKernel()
	if err != nil {
		return nil, err
	}
	accel := Accel()
	cfg = withDefaults(cfg, accel)
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()

	tmp, err := os.MkdirTemp("", "kproxy-vm-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)

	nonce, err := newNonce()
	if err != nil {
		return nil, err
	}
	gc, err := guestConfig(cfg, k, nonce)
	if err != nil {
		return nil, err
	}
	initrd := filepath.Join(tmp, "initramfs.cpio")
	if err := buildInitramfs(ctx, k, gc, tmp, initrd); err != nil {
		return nil, err
	}
	args := qemuArgs(qemuSpec{
		Accel:     accel,
		MemoryMiB: cfg.MemoryMiB,
		CPUs:      cfg.CPUs,
		Kernel:    k.Image,
		Initrd:    initrd,
		Cmdline:   kernelCmdline(cfg.Debug),
	})
	klog.V(2).InfoS("Starting test VM", "accel", accel, "kernel", k.Release, "argv", cfg.Argv)
	return runQEMU(ctx, cfg, nonce, accel, args)
}

func withDefaults(cfg Config, accel string) Config {
	if cfg.MemoryMiB == 0 {
		cfg.MemoryMiB = DefaultMemoryMiB
	}
	if cfg.CPUs == 0 {
		cfg.CPUs = DefaultCPUs
	}
	cfg.CPUs = min(cfg.CPUs, runtime.NumCPU())
	if cfg.BootTimeout == 0 {
		cfg.BootTimeout = time.Minute
		if accel == "tcg" {
			cfg.BootTimeout = 5 * time.Minute
		}
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if os.Getenv(EnvDebug) == "1" {
		cfg.Debug = true
	}
	return cfg
}

func newNonce() (string, error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// guestConfig is what the init is told; binds are resolved on the host.
func guestConfig(cfg Config, k *Kernel, nonce string) (*guest.Config, error) {
	gc := &guest.Config{
		Nonce:       nonce,
		ModulesRoot: k.Dir,
		Release:     k.Release,
		Modules:     cfg.Modules,
		Tmpfs:       DefaultTmpfs,
		Argv:        cfg.Argv,
		Env:         cfg.Env,
		Dir:         cfg.Dir,
		Debug:       cfg.Debug,
	}
	for _, b := range cfg.Binds {
		abs, err := filepath.Abs(b)
		if err != nil {
			return nil, err
		}
		real, err := filepath.EvalSymlinks(abs)
		if err != nil {
			return nil, fmt.Errorf("bind: %w", err)
		}
		gc.Binds = append(gc.Binds, real)
	}
	// A working directory under one of the guest's fresh tmpfs mounts (a
	// clone in /tmp, as CI may make) would be hidden by it: keep it
	// visible like a bind.
	if cfg.Dir != "" {
		if dir, err := filepath.EvalSymlinks(cfg.Dir); err == nil {
			for _, t := range gc.Tmpfs {
				if (dir == t || strings.HasPrefix(dir, t+"/")) && !slices.Contains(gc.Binds, dir) {
					gc.Binds = append(gc.Binds, dir)
				}
			}
		}
	}
	return gc, nil
}

// buildInitramfs builds the init and packs it with the early modules and
// the guest's config.
func buildInitramfs(ctx context.Context, k *Kernel, gc *guest.Config, tmp, out string) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	initBin := filepath.Join(tmp, "init")
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", initBin, initPackage)
	build.Dir = root
	// Static: the initramfs has no libc.
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building the VM init: %w\n%s", err, b)
	}
	mods, err := k.Modules()
	if err != nil {
		return err
	}
	order, err := mods.Order(initrdModules...)
	if err != nil {
		return fmt.Errorf("initramfs modules: %w", err)
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	bw := bufio.NewWriter(f)
	w := newCPIOWriter(bw)
	for _, d := range []string{"dev", "proc", "sys", "host", "newroot", strings.TrimPrefix(guest.ModulesDir, "/")} {
		w.Dir(d, 0o755)
	}
	// The kernel gives init /dev/console as stdin, stdout and stderr only
	// if the node exists in the initramfs (devtmpfs comes later).
	w.CharDev("dev/console", 0o600, 5, 1)
	for _, rel := range order {
		data, err := os.ReadFile(filepath.Join(k.ModulesDir(), rel))
		if err != nil {
			return err
		}
		name := guest.ModulesDir + "/" + filepath.Base(rel)
		w.File(name, 0o644, data)
		gc.InitrdModules = append(gc.InitrdModules, name)
	}
	cfgJSON, err := json.Marshal(gc)
	if err != nil {
		return err
	}
	w.File(guest.ConfigPath, 0o644, cfgJSON)
	initData, err := os.ReadFile(initBin)
	if err != nil {
		return err
	}
	w.File("init", 0o755, initData)
	if err := w.Close(); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	return f.Close()
}

// kernelCmdline: the console on the first serial port (qemu's stdout);
// panic=-1 reboots at once on a panic, which -no-reboot turns into qemu
// exiting; quiet keeps boot messages out of the command's output.
func kernelCmdline(debug bool) string {
	args := []string{"console=ttyS0", "rdinit=/init", "panic=-1", "mitigations=off"}
	if debug {
		args = append(args, "loglevel=7")
	} else {
		args = append(args, "quiet", "loglevel=3")
	}
	return strings.Join(args, " ")
}

type qemuSpec struct {
	Accel          string
	MemoryMiB      int
	CPUs           int
	Kernel, Initrd string
	Cmdline        string
}

// qemuArgs is qemu's command line: no default devices, no display, the
// serial console on stdout, and the host's root as a read-only 9p share.
// multidevs=remap keeps inode numbers unique across the host's mounts.
func qemuArgs(s qemuSpec) []string {
	cpu := "max"
	if s.Accel == "kvm" {
		cpu = "host"
	}
	return []string{
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-machine", "q35", "-accel", s.Accel, "-cpu", cpu,
		"-m", strconv.Itoa(s.MemoryMiB), "-smp", strconv.Itoa(s.CPUs),
		"-kernel", s.Kernel, "-initrd", s.Initrd, "-append", s.Cmdline,
		"-serial", "stdio",
		"-fsdev", "local,id=" + guest.MountTag + ",path=/,security_model=none,readonly=on,multidevs=remap",
		"-device", "virtio-9p-pci,fsdev=" + guest.MountTag + ",mount_tag=" + guest.MountTag,
	}
}

// powerOffGrace is how long qemu may take to exit after the command ended.
const powerOffGrace = 15 * time.Second

// runQEMU runs qemu and follows the console: boot lines until the ready
// marker, then the command's output until the exit marker. It reads the
// console until qemu has exited (killing it on timeouts), so no goroutine
// outlives it.
func runQEMU(ctx context.Context, cfg Config, nonce, accel string, args []string) (*Result, error) {
	// If the test binary dies (a go test timeout), the kernel kills qemu
	// too. The death signal follows the thread that started qemu, so this
	// goroutine keeps its thread until qemu is gone: Go ends threads that
	// a goroutine left locked (the netns harness does), and one of those
	// could otherwise have been the parent.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd := exec.Command(qemuBinary, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting qemu: %w", err)
	}
	res := &Result{Accel: accel}
	var once sync.Once
	kill := func() { once.Do(func() { _ = cmd.Process.Kill() }) }
	defer kill()

	lines := make(chan string, 64)
	exited := make(chan error, 1)
	go func() {
		r := bufio.NewReader(stdout)
		for {
			s, err := r.ReadString('\n')
			if s != "" {
				lines <- strings.TrimRight(s, "\r\n")
			}
			if err != nil {
				break
			}
		}
		close(lines)
		// Wait closes the pipe: only after the last read.
		exited <- cmd.Wait()
	}()

	con := &console{nonce: nonce, output: cfg.Output, exitCode: -1}
	var failure error
	fail := func(err error) {
		if failure == nil {
			failure = err
		}
		kill()
	}
	boot := time.NewTimer(cfg.BootTimeout)
	defer boot.Stop()
	// Each event source is disarmed (nil channel) after it fired once, so
	// a closed context cannot spin the loop.
	bootC, stop := boot.C, ctx.Done()
	var grace <-chan time.Time // armed once, by the exit marker
	graceArmed := false
	for open := true; open; {
		select {
		case line, ok := <-lines:
			if !ok {
				open = false
				break
			}
			con.line(line)
			if con.err != nil {
				fail(con.err)
			}
			if con.ready && bootC != nil {
				res.Boot = time.Since(start)
				boot.Stop()
				bootC = nil
			}
			if con.exited && !graceArmed {
				grace, graceArmed = time.After(powerOffGrace), true
			}
		case <-bootC:
			bootC = nil
			fail(fmt.Errorf("the VM did not start the command within %v (%s)", cfg.BootTimeout, accel))
		case <-grace:
			grace = nil
			kill() // the result is in; qemu hangs on power-off
		case <-stop:
			stop = nil
			fail(fmt.Errorf("the VM run was stopped: %w", ctx.Err()))
		}
	}
	waitErr := <-exited
	res.Total = time.Since(start)
	res.ExitCode = con.exitCode
	res.Console = con.lines
	if failure == nil && !con.exited {
		failure = fmt.Errorf("the VM ended without reporting the command's exit code (qemu: %v)", waitErr)
	}
	if failure != nil {
		return res, fmt.Errorf("%w\nqemu stderr: %s\nlast console lines:\n%s", failure,
			strings.TrimSpace(stderr.String()), tail(con.lines, consoleTailLines))
	}
	return res, nil
}

// console sorts the VM's console lines: boot messages until the ready
// marker, the command's output until the exit marker, then boot messages
// again (power-off).
type console struct {
	nonce    string
	output   func(string)
	lines    []string // not the command's output
	ready    bool
	exited   bool
	exitCode int
	err      error // the init's error marker or a bad exit marker
}

func (c *console) line(line string) {
	kind, rest, text, isMarker := splitMarker(line, c.nonce)
	if !isMarker || text != "" {
		if c.ready && !c.exited {
			if c.output != nil {
				c.output(text)
			}
		} else {
			c.lines = append(c.lines, text)
		}
	}
	if !isMarker {
		return
	}
	switch kind {
	case guest.MarkReady:
		c.ready = true
	case guest.MarkExit:
		code, err := guest.ParseExit(rest)
		if err != nil && c.err == nil {
			c.err = err
		}
		c.exited, c.exitCode = true, code
	case guest.MarkError:
		if c.err == nil {
			c.err = fmt.Errorf("the VM's init failed: %s", rest)
		}
	}
}

// splitMarker finds a marker of nonce in a console line. A marker can follow
// output without a final newline on the same line: text is what precedes
// it (or the whole line when there is no marker).
func splitMarker(line, nonce string) (kind, rest, text string, ok bool) {
	i := strings.Index(line, guest.MarkerPrefix(nonce))
	if i < 0 {
		return "", "", line, false
	}
	kind, rest, ok = guest.ParseMarker(line[i:], nonce)
	if !ok {
		return "", "", line, false
	}
	return kind, rest, line[:i], true
}

func tail(lines []string, n int) string {
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// lockedBuffer collects qemu's stderr (written by exec's copier goroutine).
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

var _ io.Writer = (*lockedBuffer)(nil)
