// Command pause is the sandbox ("infra") container of the test cluster's
// pods, imported into every node's containerd as registry.k8s.io/pause
// (test/tools/images.sh). It keeps the pod's namespaces alive and does what
// upstream's pause (build/pause/linux/pause.c) does: it waits for SIGINT or
// SIGTERM and then exits 0, and it reaps the zombies of a shared PID
// namespace, whose init it is. -v prints its version. It is static
// (CGO_ENABLED=0) and needs nothing else in its image.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// version is the pause image's tag.
const version = "3.10.2"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Printf("pause.go %s\n", version)
		return
	}
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "Warning: pause should be the first process")
	}
	os.Exit(run(make(chan os.Signal, 8)))
}

// run waits on sigs for SIGINT or SIGTERM and returns the exit status 0,
// reaping exited children on every SIGCHLD in the meantime.
func run(sigs chan os.Signal) int {
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	// Children that exited before the handler was in place.
	reap()
	for sig := range sigs {
		if sig == syscall.SIGCHLD {
			reap()
			continue
		}
		fmt.Fprintf(os.Stderr, "Shutting down, got signal: %v\n", sig)
		return 0
	}
	return 0
}

// reap collects every exited child without blocking.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
