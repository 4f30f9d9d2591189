package view

import (
	"fmt"
	"io"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/iptables"
	"github.com/kproxy/kproxy/internal/proxy/ipvs"
	"github.com/kproxy/kproxy/internal/proxy/nftables"
	"github.com/kproxy/kproxy/internal/proxy/safetext"
)

// The rules each mode would write on a fresh node, as `kproxy render
// --proxy-mode` prints them: every backend's options come from its
// NewOptions, as the proxy's.

// WriteNFTables prints the transactions a fresh node would get at its
// first (full) sync, one per family, in 'nft -f' syntax.
func WriteNFTables(out io.Writer, c *v1alpha1.KubeProxyConfiguration, cl *Cluster) error {
	for _, st := range cl.States {
		opts := nftables.NewOptions(c, st.Family)
		cfg := opts.RenderConfig(cl.Node, cl.LocalAddrs())
		in := &nftables.Input{RenderInput: proxy.RenderInput{State: st, NodeName: cl.NodeName, Zone: cl.Node.Zone(), Changed: sets.New[model.ServicePortName]()}, Full: true, Now: time.Time{}}
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

// WriteIPTables prints, per family, the input of iptables-restore
// --noflush at a fresh node's first (full) sync, for the iptables backend
// b (legacy or nft); compact is --iptables-compact-layout.
func WriteIPTables(out io.Writer, c *v1alpha1.KubeProxyConfiguration, cl *Cluster, b xtables.Backend, compact bool) error {
	for _, st := range cl.States {
		opts := iptables.NewOptions(c, st.Family, cl.NodeName)
		opts.MaxChainsPerRestore = -1
		opts.CompactLayout = compact
		if b == xtables.NFT {
			opts.MaxChainsPerRestore = iptables.DefaultMaxChainsPerRestore
		}
		cfg := opts.RenderConfig(cl.Node, cl.LocalAddrs())
		in := &iptables.Input{
			RenderInput: proxy.RenderInput{State: st, NodeName: cl.NodeName, Zone: cl.Node.Zone(), Changed: sets.New[model.ServicePortName]()},
			Full:        true,
			Existing:    &iptables.Existing{},
		}
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
			st.Family, plan.ServicePorts, plan.Endpoints, bin, b, runs, plan.NATRules, plan.FilterRules)
		writeContested(out, st)
		if _, err := io.WriteString(out, plan.Text()); err != nil {
			return err
		}
	}
	return nil
}

// WriteIPVS prints, per family, what ipvs mode programs on a fresh node:
// kube-ipvs0's addresses, the virtual servers as ipvsadm -S -n writes
// them, the sets as ipset save does, and the iptables-restore input.
func WriteIPVS(out io.Writer, c *v1alpha1.KubeProxyConfiguration, cl *Cluster) error {
	for _, st := range cl.States {
		opts, err := ipvs.NewOptions(c, st.Family, cl.NodeName)
		if err != nil {
			return err
		}
		d, err := ipvs.Render(&opts.Config, st, cl.Node, ipvs.Host{Addrs: cl.LocalAddrs()})
		if err != nil {
			return err
		}
		_, _ = fmt.Fprintf(out, "# %s: %d service ports, %d virtual servers, %d addresses on %s, on a fresh node\n",
			st.Family, len(st.Services), len(d.Services), len(d.Addresses), ipvs.DummyDevice)
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

// WriteYAML prints the model view as YAML.
func WriteYAML(out io.Writer, v *Snapshot) error {
	b, err := yaml.Marshal(v)
	if err != nil {
		return err
	}
	_, err = out.Write(b)
	return err
}

// WriteJSON prints the model view as JSON (the same fields as YAML).
func WriteJSON(out io.Writer, v *Snapshot) error {
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
}
