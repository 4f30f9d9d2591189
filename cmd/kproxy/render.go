package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/proxy/iptables"
	"github.com/kproxy/kproxy/internal/view"
)

type renderFlags struct {
	file   string
	output string
	// iptablesBackend is --iptables-backend: which iptables-restore the
	// rules are shown for (legacy or nft).
	iptablesBackend string
	// compact is --iptables-compact-layout.
	compact bool
}

func newRenderCommand() *cobra.Command {
	o := config.NewOptions()
	var rf renderFlags
	cmd := &cobra.Command{
		Use:   "render",
		Short: "Show what kproxy does for a snapshot of a cluster (no root, no cluster needed)",
		Long: `render reads a snapshot of Services, EndpointSlices and Nodes (-f FILE or
DIRECTORY as 'kubectl get svc,endpointslices,nodes -A -o yaml' writes them; the
built-in example when -f is not given), applies the same model and endpoint
selection as the proxy for the node named by --hostname-override, and prints
either the model (-o table|wide|yaml|json: every service port, its addresses,
the endpoints chosen for this node and why others were left out; the table
shows each port's first address and how many more it has, wide shows them
all with the traffic policies and the endpoints chosen) or, with
--proxy-mode, the exact rules the proxy would write on a fresh node
(nftables: the 'nft -f' transaction; iptables: the input of
'iptables-restore --noflush', for the backend --iptables-backend names;
ipvs: kube-ipvs0's addresses, the virtual servers as 'ipvsadm -S -n' writes
them, the sets as 'ipset save' does, and the iptables-restore input).

It accepts the proxy's flags and --config, since they shape the result.`,
		Example: `  kproxy render                                # the built-in example, as a table
  kproxy render --proxy-mode nftables          # the nftables rules for node-a
  kproxy render --proxy-mode iptables --iptables-backend legacy
  kproxy render --proxy-mode ipvs --ipvs-scheduler wlc
  kproxy render -o wide                        # every address, policy and endpoint
  kproxy render -f cluster.yaml --hostname-override worker-1 -o yaml`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := completeOptions(cmd, o); err != nil {
				return err
			}
			rulesWanted := cmd.Flags().Changed("proxy-mode") || (o.ConfigFile != "" && o.Config.Mode != "")
			if cmd.Flags().Changed("output") {
				rulesWanted = false
			}
			return render(cmd.OutOrStdout(), cmd.ErrOrStderr(), o, rf, rulesWanted)
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	fs := cmd.Flags()
	o.AddFlags(fs)
	config.AddKlogFlags(fs)
	fs.StringVarP(&rf.file, "filename", "f", "", "Snapshot file or directory (YAML/JSON, kubectl's List format works). Default: the built-in example.")
	fs.StringVarP(&rf.output, "output", "o", "table", "Model output format: table, wide (every address, the policies and endpoints), yaml or json. Ignored when --proxy-mode asks for rules.")
	fs.StringVar(&rf.iptablesBackend, "iptables-backend", "", "With --proxy-mode iptables: the iptables backend the restore input is for, legacy or nft (default: IPTABLES_MODE, else nft). Both get the same bytes, except that a sync of more than "+strconv.Itoa(iptables.DefaultMaxChainsPerRestore)+" chains is split into several iptables-nft-restore runs.")
	fs.BoolVar(&rf.compact, "iptables-compact-layout", false, compactLayoutHelp)
	return cmd
}

func render(out, errOut io.Writer, o *config.Options, rf renderFlags, rules bool) error {
	cl, err := loadSnapshot(errOut, o, rf.file)
	if err != nil {
		return err
	}
	if rules {
		switch mode := config.EffectiveMode(o.Config); mode {
		case config.ModeNFTables:
			return view.WriteNFTables(out, o.Config, cl)
		case config.ModeIPTables:
			backend := xtables.Backend(rf.iptablesBackend)
			if backend == "" {
				backend = xtables.NFT
				if o.IPTablesMode == config.IPTablesModeLegacy {
					backend = xtables.Legacy
				}
			}
			if backend != xtables.Legacy && backend != xtables.NFT {
				return usageError{fmt.Errorf("unknown --iptables-backend %q: use legacy or nft", rf.iptablesBackend)}
			}
			return view.WriteIPTables(out, o.Config, cl, backend, rf.compact)
		case config.ModeIPVS:
			return view.WriteIPVS(out, o.Config, cl)
		default:
			return usageError{fmt.Errorf("rendering rules for --proxy-mode %s is not available yet; use --proxy-mode nftables, iptables or ipvs, or -o table|wide|yaml|json for the model", mode)}
		}
	}
	switch strings.ToLower(rf.output) {
	case "table", "":
		return view.WriteTable(out, cl.Model())
	case "wide":
		return view.WriteWideTable(out, cl.Model())
	case "yaml":
		return view.WriteYAML(out, cl.Model())
	case "json":
		return view.WriteJSON(out, cl.Model())
	default:
		return usageError{fmt.Errorf("unknown output format %q: use table, wide, yaml or json", rf.output)}
	}
}

// loadSnapshot is view.Load; a snapshot whose node is not named is a
// usage error.
func loadSnapshot(errOut io.Writer, o *config.Options, path string) (*view.Cluster, error) {
	cl, err := view.Load(errOut, o.Config, path)
	if nc := (*view.NodeNotChosenError)(nil); errors.As(err, &nc) {
		return nil, usageError{err}
	}
	return cl, err
}
