// Command kproxy is a Kubernetes service proxy: a drop-in replacement for
// kube-proxy with the same flags, config file, metrics and health endpoints,
// plus `render` (the rules for a snapshot, no root or cluster needed).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	cliflag "k8s.io/component-base/cli/flag"
	// logging.format: json, registered as upstream's cmd/kube-proxy does.
	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/config"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "v0.1.0-dev"

func main() { os.Exit(run()) }

func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer klog.Flush()
	cmd := newRootCommand()
	if err := cmd.ExecuteContext(ctx); err != nil {
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintln(os.Stderr, "Error:", err)
			return 2
		}
		fmt.Fprintln(os.Stderr, "Error:", err)
		return 1
	}
	return 0
}

// compactLayoutHelp documents --iptables-compact-layout (kproxy only).
const compactLayoutHelp = "kproxy only, iptables mode: leave out the per-endpoint KUBE-SEP-* chains (KUBE-SVC-*/KUBE-SVL-* rules DNAT directly, hairpin traffic is marked in KUBE-POSTROUTING). About a third of the rules and half the restore bytes: faster syncs, but 'iptables-save | grep KUBE-SEP' finds nothing. Default: upstream's layout."

// usageError marks errors in what the user asked for (bad flags, config).
type usageError struct{ error }

func (u usageError) Unwrap() error { return u.error }

func newRootCommand() *cobra.Command {
	o := config.NewOptions()
	var fromFile string
	var compact bool
	var ver *versionFlag
	cmd := &cobra.Command{
		Use:   "kproxy",
		Short: "kproxy: a Kubernetes service proxy (drop-in kube-proxy)",
		Long: `kproxy runs on every node. It watches Services, EndpointSlices and its Node
and programs the kernel so that traffic to ClusterIPs, NodePorts, LoadBalancer
and external IPs reaches the endpoints. Flags, config file, metrics and health
endpoints are those of kube-proxy.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Before anything else, as upstream's verflag.
			if ver.print(cmd.OutOrStdout()) {
				return nil
			}
			if err := completeOptions(cmd, o); err != nil {
				return err
			}
			for _, w := range o.Warnings() {
				klog.Warning(w)
			}
			if o.WriteConfigTo != "" {
				// Upstream writes the effective configuration and exits
				// before cleanup or any kernel work.
				return config.WriteConfigFile(o.WriteConfigTo, o.Config)
			}
			return runProxy(cmd.Context(), o, cmd.Flags(), fromFile, compact)
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	// "--cluster_cidr" is "--cluster-cidr", on every command, as
	// component-base's cli.Run sets it up for kube-proxy.
	cmd.SetGlobalNormalizationFunc(cliflag.WordSepNormalizeFunc)
	fs := cmd.Flags()
	o.AddFlags(fs)
	config.AddKlogFlags(fs)
	ver = addVersionFlag(fs)
	fs.StringVar(&fromFile, "from-file", "", "kproxy only: read Services, EndpointSlices and Nodes from this YAML/JSON file or directory (as 'kubectl get svc,endpointslices,nodes -A -o yaml' writes them) instead of the API server, and follow its changes.")
	fs.BoolVar(&compact, "iptables-compact-layout", false, compactLayoutHelp)
	cmd.AddCommand(newRenderCommand(), newTraceCommand(), newDoctorCommand(), newVersionCommand())
	return cmd
}

// completeOptions builds and validates the effective configuration; every
// problem is reported before anything touches the kernel.
func completeOptions(cmd *cobra.Command, o *config.Options) error {
	if err := o.Complete(cmd.Flags(), os.Getenv); err != nil {
		return usageError{err}
	}
	if err := config.ApplyLogging(o.Config); err != nil {
		return usageError{err}
	}
	if err := o.Validate(); err != nil {
		return usageError{fmt.Errorf("invalid configuration:\n%w", err)}
	}
	return nil
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the kproxy version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintln(cmd.OutOrStdout(), "kproxy", version)
		},
	}
}
