package view

import (
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/iptables"
	"github.com/kproxy/kproxy/internal/proxy/ipvs"
	"github.com/kproxy/kproxy/internal/proxy/nftables"
	"github.com/kproxy/kproxy/internal/proxy/safetext"
	"github.com/kproxy/kproxy/internal/trace/node"
)

// The rules each mode would write on a fresh node, as `kproxy render
// --proxy-mode` prints them: every backend's options come from its
// NewOptions, as the proxy's.

// FreshNFTables renders the transaction of family st.Family that a
// fresh node's first (full) sync applies.
func (cl *Cluster) FreshNFTables(c *v1alpha1.KubeProxyConfiguration, st *model.State) *nftables.Plan {
	opts := nftables.NewOptions(c, st.Family)
	cfg := opts.RenderConfig(cl.Node, cl.LocalAddrs())
	in := &nftables.Input{RenderInput: cl.renderInput(st), Full: true, Now: time.Time{}}
	return nftables.Render(cfg, in, nftables.NewApplied())
}

// FreshIPTables renders the iptables-restore input of family st.Family
// that a fresh node's first (full) sync applies with iptables backend b
// (nft splits it into runs of iptables.DefaultMaxChainsPerRestore chains,
// legacy does not); local are the host's addresses, compact is
// --iptables-compact-layout.
func (cl *Cluster) FreshIPTables(c *v1alpha1.KubeProxyConfiguration, st *model.State, local []netip.Addr, b xtables.Backend, compact bool) *iptables.Plan {
	opts := iptables.NewOptions(c, st.Family, cl.NodeName)
	opts.MaxChainsPerRestore = -1
	opts.CompactLayout = compact
	if b == xtables.NFT {
		opts.MaxChainsPerRestore = iptables.DefaultMaxChainsPerRestore
	}
	cfg := opts.RenderConfig(cl.Node, local)
	in := &iptables.Input{RenderInput: cl.renderInput(st), Full: true, Existing: &iptables.Existing{}}
	return iptables.Render(cfg, in, iptables.NewApplied())
}

// FreshIPVS renders what ipvs mode programs for family st.Family on a
// fresh node.
func (cl *Cluster) FreshIPVS(c *v1alpha1.KubeProxyConfiguration, st *model.State) (*ipvs.Plan, error) {
	opts, err := ipvs.NewOptions(c, st.Family, cl.NodeName)
	if err != nil {
		return nil, err
	}
	return ipvs.Render(&opts.Config, st, cl.Node, ipvs.Host{Addrs: cl.LocalAddrs()})
}

// renderInput is a full sync's view of st on the snapshot's node.
func (cl *Cluster) renderInput(st *model.State) proxy.RenderInput {
	return proxy.RenderInput{State: st, NodeName: cl.NodeName, Zone: cl.Node.Zone(), Changed: sets.New[model.ServicePortName]()}
}

// ForTrace renders the rules of mode (a config.Mode*) as a fresh node's
// first sync, for trace: nftables both families, iptables and ipvs
// family fam. local are the host's addresses for iptables mode (empty:
// the node's).
func (cl *Cluster) ForTrace(c *v1alpha1.KubeProxyConfiguration, mode string, fam v1.IPFamily, local []netip.Addr) (*node.Rendered, error) {
	r := &node.Rendered{NodeAddrs: cl.LocalAddrs()}
	if mode == config.ModeNFTables {
		var b strings.Builder
		for _, st := range cl.States {
			b.WriteString(cl.FreshNFTables(c, st).Tx.String())
		}
		r.Text = b.String()
		return r, nil
	}
	var st *model.State
	for _, s := range cl.States {
		if s.Family == fam {
			st = s
		}
	}
	if st == nil {
		return nil, fmt.Errorf("the snapshot has no %s services", fam)
	}
	if mode == config.ModeIPVS {
		d, err := cl.FreshIPVS(c, st)
		r.IPVS = d
		return r, err
	}
	if len(local) == 0 {
		local = r.NodeAddrs
	}
	// Legacy: one restore, as trace reads it.
	r.Text = cl.FreshIPTables(c, st, local, xtables.Legacy, false).Text()
	return r, nil
}

// WriteNFTables prints the transactions a fresh node would get at its
// first (full) sync, one per family, in 'nft -f' syntax.
func WriteNFTables(out io.Writer, c *v1alpha1.KubeProxyConfiguration, cl *Cluster) error {
	for _, st := range cl.States {
		plan := cl.FreshNFTables(c, st)
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
		plan := cl.FreshIPTables(c, st, cl.LocalAddrs(), b, compact)
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
		d, err := cl.FreshIPVS(c, st)
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
