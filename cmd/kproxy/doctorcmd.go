package main

import (
	"github.com/spf13/cobra"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/doctor"
)

func newDoctorCommand() *cobra.Command {
	o := config.NewOptions()
	var metricsURL string
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Say what is installed on this host for each proxy mode and what is wrong",
		Long: `doctor reads this host's kernel and tools (it changes nothing) and reports:
which iptables backends are installed and which one kproxy's iptables mode
would choose (IPTABLES_MODE, else detection) and why; kube-proxy rules in
each backend; the nftables mode's tables; IPVS: kube-ipvs0, every virtual
server and whether it is kube-proxy's or another program's, the timeouts,
schedulers without a kernel module; IPVS leftovers; the sysctls a
proxy depends on; and what a running kproxy or kube-proxy says on
/proxyMode; the other netfilter users it sees (nftables base chains of
other tables with their hooks, priorities and policies; non-KUBE chains
hooked into the built-in chains kube-proxy uses, in both iptables
backends). Then it lists what is wrong: rules of two modes or two
iptables backends at once (they all run, and stale ones misroute
traffic), chains of others that drop service traffic (a forward-hook
chain with policy drop), IPTABLES_MODE set in nftables mode (no effect),
missing binaries, IP forwarding off, in ipvs mode a scheduler without
its module, and ipvs mode's leftovers after a switch to another mode.
Run it as root on the node.
Exit status 1 when it found an error.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := completeOptions(cmd, o); err != nil {
				return err
			}
			return doctor.Run(cmd.Context(), cmd.OutOrStdout(), doctor.Options{
				Config: o.Config, IPTablesMode: o.IPTablesMode, MetricsURL: metricsURL})
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	fs := cmd.Flags()
	o.AddFlags(fs)
	config.AddKlogFlags(fs)
	fs.StringVar(&metricsURL, "metrics-url", "http://127.0.0.1:10249", "Where a running kproxy or kube-proxy serves /proxyMode.")
	return cmd
}
