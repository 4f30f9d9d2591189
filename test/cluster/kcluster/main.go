// Command kcluster runs the multi-node test cluster of package cluster for
// a developer; hack/cluster.sh builds and calls it (see there for usage).
//
// "up" starts "serve" as a process of its own session, which owns the
// cluster until SIGTERM, and returns once every node is Ready; "down"
// signals that server and then sweeps whatever is left (also what a killed
// server left behind).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kproxy/kproxy/test/cluster"
	"github.com/kproxy/kproxy/test/e2e/framework"
)

const usage = `usage: kcluster [--name NAME] [--nodes N] COMMAND
  up                                  start the cluster (returns when every node is Ready)
  down                                stop it and remove everything it made
  status                              say whether it is up, and how to use it
  kubectl ARGS...                     kubectl as admin, inside the control plane's network namespace
  deploy kproxy [--mode nftables|iptables] [--backend legacy|nft]
                                      import the image on every node, apply deploy/kproxy.yaml, wait for the rollout;
                                      --backend forces iptables mode's backend (IPTABLES_MODE)
  deploy kube-proxy [--mode ...] [--backend ...]
                                      upstream kube-proxy v1.37.2 as kubeadm deploys it (the control), instead
`

// upTimeout bounds "up": a cold start on a loaded 2-core machine.
const upTimeout = 10 * time.Minute

func main() {
	var cfg cluster.Config
	flag.StringVar(&cfg.Name, "name", "kproxy-cluster", "cluster name (directories /var/lib/NAME, /run/NAME)")
	flag.IntVar(&cfg.Nodes, "nodes", 3, "number of nodes")
	flag.Usage = func() { fmt.Fprint(os.Stderr, usage) }
	flag.Parse()
	args := flag.Args()
	if len(args) == 0 {
		flag.Usage()
		os.Exit(2)
	}
	var err error
	switch args[0] {
	case "up":
		err = up(cfg)
	case "serve":
		err = serve(cfg)
	case "down":
		err = down(cfg)
	case "status":
		err = status(cfg)
	case "kubectl":
		err = kubectl(cfg, args[1:])
	case "deploy":
		err = deploy(cfg, args[1:])
	default:
		flag.Usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kcluster %s: %v\n", args[0], err)
		os.Exit(1)
	}
}

// logPath is the server's log.
func logPath(cfg cluster.Config) string { return filepath.Join(os.TempDir(), cfg.Name+".log") }

func up(cfg cluster.Config) error {
	if pid := cluster.OwnerAlive(cfg); pid != 0 {
		fmt.Printf("cluster %s is already up (server pid %d)\n", cfg.Name, pid)
		return status(cfg)
	}
	if m := cfg.Missing(); len(m) > 0 {
		return fmt.Errorf("missing %s", strings.Join(m, ", "))
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	log, err := os.Create(logPath(cfg))
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(self, "--name="+cfg.Name, fmt.Sprintf("--nodes=%d", cfg.Nodes), "serve")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	began := time.Now()
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	fmt.Printf("starting cluster %s (server pid %d, log %s)\n", cfg.Name, cmd.Process.Pid, logPath(cfg))
	deadline := time.After(upTimeout)
	for {
		select {
		case err := <-exited:
			b, _ := os.ReadFile(logPath(cfg))
			return fmt.Errorf("the server exited (%v):\n%s", err, cluster.TailLines(string(b), 40))
		case <-deadline:
			return fmt.Errorf("not up after %s; see %s, and run down", upTimeout, logPath(cfg))
		case <-time.After(time.Second):
		}
		if cluster.OwnerAlive(cfg) == cmd.Process.Pid && ready(cfg) {
			fmt.Printf("cluster %s up in %s\n", cfg.Name, time.Since(began).Round(time.Second))
			return status(cfg)
		}
	}
}

func ready(cfg cluster.Config) bool {
	_, err := cluster.Attach(framework.NewSuite("kcluster"), cfg)
	return err == nil
}

// serve brings the cluster up and keeps it until SIGTERM or SIGINT.
func serve(cfg cluster.Config) error {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	life := framework.NewSuite("cluster " + cfg.Name)
	err := life.Run(func() { cluster.Up(life, cfg) })
	if err == nil {
		s := <-sigs
		fmt.Fprintf(os.Stderr, "%s: stopping the cluster\n", s)
	}
	return errors.Join(err, life.Close())
}

// down stops the server (SIGTERM: it stops every process and removes what
// the cluster made) and then sweeps whatever is left.
func down(cfg cluster.Config) error {
	if pid := cluster.OwnerAlive(cfg); pid != 0 {
		fmt.Printf("stopping cluster %s (server pid %d)\n", cfg.Name, pid)
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			return err
		}
		deadline := time.Now().Add(5 * time.Minute)
		for cluster.OwnerAlive(cfg) == pid {
			if time.Now().After(deadline) {
				return fmt.Errorf("server pid %d still runs after 5 minutes; see %s", pid, logPath(cfg))
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	if err := cluster.Sweep(cfg); err != nil {
		return err
	}
	fmt.Printf("cluster %s is down\n", cfg.Name)
	return nil
}

func status(cfg cluster.Config) error {
	c, err := cluster.Attach(framework.NewSuite("kcluster"), cfg)
	if err != nil {
		fmt.Printf("cluster %s: %v\n", cfg.Name, err)
		return nil
	}
	fmt.Printf("cluster %s: control plane in netns %s (API server https://%s:%d), admin kubeconfig %s\n",
		cfg.Name, c.CP.Namespace, framework.ControlPlaneIP4, framework.APIServerPort, cfg.AdminKubeconfig())
	for _, n := range c.Nodes {
		fmt.Printf("  %s  netns %-28s  IP %-14s pod CIDR %s  containerd %s\n", n.Name, n.Namespace, n.IP, n.PodCIDR, n.Socket)
	}
	fmt.Printf("use: hack/cluster.sh kubectl get nodes   (= ip netns exec %s kubectl --kubeconfig %s ...)\n",
		c.CP.Namespace, cfg.AdminKubeconfig())
	return nil
}

func kubectl(cfg cluster.Config, args []string) error {
	c, err := cluster.Attach(framework.NewSuite("kcluster"), cfg)
	if err != nil {
		return err
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		return err
	}
	argv := append([]string{"ip", "netns", "exec", c.CP.Namespace,
		filepath.Join(c.Config.BinDir, "kubectl"), "--kubeconfig=" + cfg.AdminKubeconfig()}, args...)
	return syscall.Exec(ip, argv, os.Environ())
}

func deploy(cfg cluster.Config, args []string) error {
	fs := flag.NewFlagSet("deploy", flag.ContinueOnError)
	mode := fs.String("mode", "nftables", "the proxy's mode: nftables, iptables or ipvs")
	backend := fs.String("backend", "", "iptables and ipvs modes: the iptables backend to force, legacy or nft (default: the proxy's choice)")
	if len(args) == 0 {
		return errors.New("deploy what? kproxy or kube-proxy")
	}
	what := args[0]
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *backend != "" {
		*mode += "-" + *backend
	}
	if _, _, err := cluster.SplitMode(*mode); err != nil {
		return err
	}
	life := framework.NewSuite("deploy")
	c, err := cluster.Attach(life, cfg)
	if err != nil {
		return err
	}
	ctx := context.Background()
	began := time.Now()
	switch what {
	case "kproxy":
		err = c.DeployKproxy(ctx, *mode)
	case "kube-proxy":
		err = c.DeployKubeProxy(ctx, *mode)
	default:
		return fmt.Errorf("deploy %s: kproxy or kube-proxy", what)
	}
	if err != nil {
		return err
	}
	fmt.Printf("%s deployed and rolled out in %s\n", what, time.Since(began).Round(time.Second))
	return nil
}
