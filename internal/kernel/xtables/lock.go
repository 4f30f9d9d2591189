package xtables

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// The legacy backend serializes its users with flock(2) on one file,
// /run/xtables.lock unless XTABLES_LOCKFILE names another (iptables reads
// that variable too, and the binaries inherit kproxy's environment). The
// kubelet, CNI plugins and firewalld take it as well. The nft backend
// does not use it: nf_tables transactions are serialized by the kernel.
const defaultLockFile = "/run/xtables.lock"

func lockFile() string {
	if p := os.Getenv("XTABLES_LOCKFILE"); p != "" {
		return p
	}
	return defaultLockFile
}

// lockPoll is how often waitForLock tries again; iptables 1.6 polled the
// lock every 1 s by default, kube-proxy asked it for 100 ms.
const lockPoll = 20 * time.Millisecond

// waitForLock waits until nobody holds the xtables lock, at most max, and
// returns how long it waited (0 when the lock was free). It takes the lock
// only to test it and lets it go at once: iptables-restore takes it
// itself. If the lock file cannot be opened, it does not wait: the
// restore's own -w bound applies.
func waitForLock(ctx context.Context, path string, max time.Duration, now func() time.Time) (time.Duration, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		klog.V(4).InfoS("Cannot open the xtables lock file; not measuring the lock wait", "path", path, "err", err)
		return 0, nil
	}
	defer f.Close()
	start := now()
	for first := true; ; first = false {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			// Closing the file releases the lock.
			if first {
				return 0, nil
			}
			return now().Sub(start), nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			klog.V(4).InfoS("Cannot test the xtables lock; not measuring the lock wait", "path", path, "err", err)
			return 0, nil
		}
		waited := now().Sub(start)
		if waited >= max {
			return waited, fmt.Errorf("%w: %s held by another program for more than %s", ErrLockTimeout, path, max)
		}
		t := time.NewTimer(min(lockPoll, max-waited))
		select {
		case <-ctx.Done():
			t.Stop()
			return now().Sub(start), ctx.Err()
		case <-t.C:
		}
	}
}
