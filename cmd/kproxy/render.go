package main

import (
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/iptables"
	ipvsmode "github.com/kproxy/kproxy/internal/proxy/ipvs"
	"github.com/kproxy/kproxy/internal/proxy/nftables"
	"github.com/kproxy/kproxy/internal/proxy/safetext"
	"github.com/kproxy/kproxy/internal/source/file"
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
either the model (-o table|yaml|json: every service port, its addresses, the
endpoints chosen for this node and why others were left out) or, with
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
	fs.StringVarP(&rf.output, "output", "o", "table", "Model output format: table, yaml or json. Ignored when --proxy-mode asks for rules.")
	fs.StringVar(&rf.iptablesBackend, "iptables-backend", "", "With --proxy-mode iptables: the iptables backend the restore input is for, legacy or nft (default: IPTABLES_MODE, else nft). Both get the same bytes, except that a sync of more than "+strconv.Itoa(iptables.DefaultMaxChainsPerRestore)+" chains is split into several iptables-nft-restore runs.")
	fs.BoolVar(&rf.compact, "iptables-compact-layout", false, compactLayoutHelp)
	return cmd
}

// defaultExampleNode is the example's node that render shows by default.
const defaultExampleNode = "node-a"

func render(out, errOut io.Writer, o *config.Options, rf renderFlags, rules bool) error {
	snap, err := loadSnapshot(errOut, o, rf.file)
	if err != nil {
		return err
	}
	states, node, nodeName := snap.states, snap.node, snap.nodeName

	if rules {
		switch mode := config.EffectiveMode(o.Config); mode {
		case config.ModeNFTables:
			return renderNFTables(out, o, states, node, nodeName)
		case config.ModeIPTables:
			return renderIPTables(out, o, rf, states, node, nodeName)
		case config.ModeIPVS:
			return renderIPVS(out, o, states, node, nodeName)
		default:
			return usageError{fmt.Errorf("rendering rules for --proxy-mode %s is not available yet; use --proxy-mode nftables, iptables or ipvs, or -o table|yaml|json for the model", mode)}
		}
	}

	v := view.Build(states, node, nodeName)
	v.Skipped = snap.skipped
	switch strings.ToLower(rf.output) {
	case "table", "":
		return view.WriteTable(out, v)
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = out.Write(b)
		return err
	case "json":
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		j, err := yaml.YAMLToJSON(b)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(out, string(j))
		return err
	default:
		return usageError{fmt.Errorf("unknown output format %q: use table, yaml or json", rf.output)}
	}
}

// snapshot is a cluster snapshot run through the proxy's model for one node.
type snapshot struct {
	states   []*model.State
	node     *model.Node
	nodeName string
	skipped  []view.SkippedEntry
}

// loadSnapshot reads a snapshot file (the built-in example when path is
// empty) and builds the model for --hostname-override's node, as the proxy
// would.
func loadSnapshot(errOut io.Writer, o *config.Options, path string) (*snapshot, error) {
	var objs *file.Objects
	var errs []error
	if path == "" {
		objs = example.Objects()
		if o.Config.ClusterCIDR == "" {
			// The example's pods live in these; without them nothing
			// would count as pod traffic.
			o.Config.ClusterCIDR = strings.Join(example.ClusterCIDRs, ",")
		}
	} else {
		objs, errs = file.Load(path)
	}
	for _, err := range errs {
		fmt.Fprintln(errOut, "warning:", err)
	}
	if objs == nil {
		return nil, fmt.Errorf("no usable objects in %s", path)
	}
	nodeName := config.NormalizeHostname(o.Config.HostnameOverride)
	if nodeName == "" {
		if path == "" {
			nodeName = defaultExampleNode
		} else if len(objs.Nodes) == 1 {
			nodeName = objs.Nodes[0].Name
		} else {
			return nil, usageError{fmt.Errorf("--hostname-override is required: the snapshot has %d nodes", len(objs.Nodes))}
		}
	}
	fams := []v1.IPFamily{model.IPv4, model.IPv6}
	snap := &snapshot{nodeName: nodeName}
	tracker := model.NewTracker(model.TrackerOptions{
		Hostname: nodeName,
		Families: fams,
		OnInvalid: func(e *model.InvalidError) {
			snap.skipped = append(snap.skipped, view.SkippedEntry{Object: e.Kind + " " + e.Object, Reason: e.Field + ": " + e.Reason})
		},
	})
	objs.Feed(tracker)
	for _, s := range objs.Services {
		if why := model.SkipService(s); why != "" && len(model.ValidateService(s)) == 0 {
			snap.skipped = append(snap.skipped, view.SkippedEntry{Object: "Service " + s.Namespace + "/" + s.Name, Reason: why})
		}
	}
	u := tracker.Take()
	for _, f := range fams {
		st := model.NewState(f)
		st.Apply(u.Families[f])
		snap.states = append(snap.states, st)
	}
	snap.node = tracker.Node()
	if snap.node == nil {
		fmt.Fprintf(errOut, "warning: node %q is not in the snapshot: no zone, pod CIDRs or addresses known\n", nodeName)
	}
	return snap, nil
}

// nodeAddrs stands in for a fresh node's local addresses: those of its Node
// object, as far as the snapshot knows them.
func nodeAddrs(node *model.Node) []netip.Addr {
	if node == nil {
		return nil
	}
	return node.Addresses
}

// renderNFTables prints the transactions a fresh node would get at its
// first (full) sync, one per family, in 'nft -f' syntax.
func renderNFTables(out io.Writer, o *config.Options, states []*model.State, node *model.Node, nodeName string) error {
	for _, st := range states {
		opts := nftables.NewOptions(o.Config, st.Family)
		cfg := opts.RenderConfig(node, nodeAddrs(node))
		in := &nftables.Input{State: st, NodeName: nodeName, Zone: node.Zone(), Full: true, Changed: sets.New[model.ServicePortName](), Now: time.Time{}}
		plan := nftables.Render(cfg, in, nftables.NewApplied())
		_, _ = fmt.Fprintf(out, "# %s: %d service ports, %d operations\n", st.Family, len(st.Services), plan.Tx.Len())
		writeContested(out, st)
		for _, c := range plan.Conflicts {
			// A conflict names services: made safe so that a name cannot
			// end the comment line and add lines of its own.
			fmt.Fprintf(out, "# conflict: %s\n", safetext.Comment(c, len(c)+64))
		}
		if _, err := io.WriteString(out, plan.Tx.String()); err != nil {
			return err
		}
	}
	return nil
}

// renderIPVS prints, per family, what ipvs mode programs on a fresh node:
// kube-ipvs0's addresses, the virtual servers as ipvsadm -S -n writes
// them, the sets as ipset save does, and the iptables-restore input.
func renderIPVS(out io.Writer, o *config.Options, states []*model.State, node *model.Node, nodeName string) error {
	for _, st := range states {
		opts, err := ipvsmode.NewOptions(o.Config, st.Family, nodeName)
		if err != nil {
			return err
		}
		d, err := ipvsmode.Render(&opts.RenderConfig, st, node, ipvsmode.Host{Addrs: nodeAddrs(node)})
		if err != nil {
			return err
		}
		_, _ = fmt.Fprintf(out, "# %s: %d service ports, %d virtual servers, %d addresses on %s, on a fresh node\n",
			st.Family, len(st.Services), len(d.Services), len(d.Addresses), ipvsmode.DummyDevice)
		writeContested(out, st)
		if _, err := io.WriteString(out, d.Text()); err != nil {
			return err
		}
	}
	return nil
}

// writeContested prints, as comments, every address a service port of st
// claims but another keeps. Names are quoted: a comment line must stay one
// line whatever a file snapshot holds.
func writeContested(out io.Writer, st *model.State) {
	for _, l := range st.Lost() {
		q := strconv.Quote(l.String())
		_, _ = fmt.Fprintf(out, "# contested: %s\n", q[1:len(q)-1])
	}
}

// renderIPTables prints, per family, the input of iptables-restore
// --noflush at a fresh node's first (full) sync.
func renderIPTables(out io.Writer, o *config.Options, rf renderFlags, states []*model.State, node *model.Node, nodeName string) error {
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
	// A fresh node's local addresses, as far as the snapshot knows them.
	var local []netip.Addr
	if node != nil {
		local = node.Addresses
	}
	for _, st := range states {
		opts := iptables.NewOptions(o.Config, st.Family, nodeName)
		opts.MaxChainsPerRestore = -1
		opts.CompactLayout = rf.compact
		if backend == xtables.NFT {
			opts.MaxChainsPerRestore = iptables.DefaultMaxChainsPerRestore
		}
		cfg := opts.RenderConfig(node, local)
		in := &iptables.Input{State: st, NodeName: nodeName, Zone: node.Zone(), Full: true,
			Changed: sets.New[model.ServicePortName](), Existing: &iptables.Existing{}}
		plan := iptables.Render(cfg, in, iptables.NewApplied())
		bin := "iptables"
		if st.Family == model.IPv6 {
			bin = "ip6tables"
		}
		runs := "one run"
		if n := len(plan.Restores); n > 1 {
			runs = strconv.Itoa(n) + " runs"
		}
		_, _ = fmt.Fprintf(out, "# %s: %d service ports, %d endpoints: %s-%s-restore --noflush on a fresh node, %s (%d nat and %d filter rules)\n",
			st.Family, plan.ServicePorts, plan.Endpoints, bin, backend, runs, plan.NATRules, plan.FilterRules)
		writeContested(out, st)
		if _, err := io.WriteString(out, plan.Text()); err != nil {
			return err
		}
	}
	return nil
}
