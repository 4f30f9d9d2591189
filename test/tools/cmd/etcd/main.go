// Command etcd is a single-member etcd for kproxy's end-to-end tests, built
// from go.etcd.io/etcd/server/v3/embed at the version kube-apiserver pins, so
// the tests need no etcd release download.
//
// It listens for clients on one URL (plain HTTP, meant for 127.0.0.1 inside
// the control plane's network namespace), keeps its data in one directory and
// has no peers. It exits when it gets SIGINT/SIGTERM or when etcd fails.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() { os.Exit(run()) }

func run() int {
	var (
		dataDir    = flag.String("data-dir", "", "directory for etcd's data (required)")
		clientURL  = flag.String("listen-client-url", "http://127.0.0.1:2379", "URL to serve clients on")
		peerURL    = flag.String("listen-peer-url", "http://127.0.0.1:2380", "URL for the (unused) peer listener; etcd always opens one")
		logLevel   = flag.String("log-level", "warn", "etcd log level: debug, info, warn, error")
		startLimit = flag.Duration("start-timeout", 30*time.Second, "give up if etcd is not ready within this time")
	)
	flag.Parse()
	if *dataDir == "" {
		fmt.Fprintln(os.Stderr, "etcd: --data-dir is required")
		return 2
	}
	cu, err := url.Parse(*clientURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: --listen-client-url: %v\n", err)
		return 2
	}
	pu, err := url.Parse(*peerURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: --listen-peer-url: %v\n", err)
		return 2
	}

	cfg := embed.NewConfig()
	cfg.Name = "kpe2e"
	cfg.Dir = *dataDir
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = *logLevel
	cfg.LogOutputs = []string{"stderr"}
	// Test data is thrown away with the namespace: fsync only slows the
	// shared CI machine down.
	cfg.UnsafeNoFsync = true

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: start: %v\n", err)
		return 1
	}
	defer e.Close()

	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintf(os.Stderr, "etcd: ready on %s\n", cu)
	case <-time.After(*startLimit):
		fmt.Fprintf(os.Stderr, "etcd: not ready after %s\n", *startLimit)
		return 1
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	select {
	case <-ctx.Done():
		return 0
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	}
}
