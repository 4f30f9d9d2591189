// Package vm runs a command, or some tests of the running test binary, in a
// throwaway qemu VM whose kernel has what the host's may lack (SCTP, IPVS,
// dummy links, as modules), so kernel tests can use those features anyway.
//
// How it works:
//   - test/vm/prepare.sh (run by .ci/run) unpacks Debian's current kernel
//     package into /var/cache/kproxy-vm/<release> and runs depmod there.
//   - Run builds the guest's init (package guest, static Go) and packs it into
//     an initramfs (a newc cpio written here) with the virtio and 9p modules
//     and a JSON config. qemu boots the kernel with KVM when the CPU offers
//     VMX/SVM, else with TCG emulation (several times slower, fine for a
//     test); 2 vCPUs, 1.5 GiB.
//   - The init mounts the host's root read-only over virtio-9p, gives the
//     guest fresh tmpfs on /tmp, /run and /var/tmp, binds the host paths it
//     was asked to keep visible (a test binary under the host's /tmp), points
//     the kernel's module autoloader at the host's modprobe on the cached
//     module tree, loads the requested modules, switches root and runs the
//     command as root with the serial console as its output.
//   - The console comes back on qemu's stdout: boot messages, then the
//     command's output, then a marker line with the exit code (marker lines
//     carry a random nonce). The VM powers itself off; qemu is killed on any
//     timeout and always before Run returns.
//
// RunTestInVM re-runs tests of the current test binary inside the VM with
// KPROXY_IN_VM=1 and streams their -test.v output into t.Log: a test that
// needs a kernel feature the host lacks calls it when Available says yes.
// KPROXY_VM=1 (set by CI) means a test must not skip for want of a VM.
//
// Run the package's own tests (a real boot each) alone with
//
//	bash test/vm/prepare.sh   # once, as root
//	go test -count=1 -v ./internal/testutil/vm/...
//
// KPROXY_VM_DEBUG=1 shows the kernel's messages and the init's steps;
// KPROXY_VM_ACCEL=kvm|tcg forces the accelerator; KPROXY_VM_KERNEL_DIR
// points at another prepared kernel directory.
package vm
