package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/kernel/execer"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/nftables"
	"github.com/kproxy/kproxy/internal/trace"
)

type traceFlags struct {
	file            string
	rules           []string
	live            bool
	src, dst, proto string
	iif             string
	local           []string
}

func newTraceCommand() *cobra.Command {
	o := config.NewOptions()
	var tf traceFlags
	cmd := &cobra.Command{
		Use:   "trace --dst IP:PORT [--src IP] [--proto tcp|udp|sctp] [--iif IFACE]",
		Short: "Show where a packet goes through kproxy's nftables or iptables rules",
		Long: `trace walks one new connection through kproxy's rules and prints
every chain and rule it meets and where it ends: which endpoint it is DNATed
to (every possible one, with its probability), whether it is masqueraded,
dropped or rejected.

The rules come from one of:
  --live         this node's kernel ('nft list table ip|ip6 kube-proxy', or
                 iptables-save of the backend kproxy would choose; root)
  --rules FILE   a saved 'nft list ruleset', 'iptables-save' or 'kproxy
                 render' output (iptables-save syntax is recognised)
  -f FILE        a cluster snapshot, rendered as 'kproxy render --proxy-mode
                 nftables|iptables' would (the built-in example when none of
                 these is given); takes render's flags (--hostname-override, ...)

Which rules: --proxy-mode iptables or nftables says; without it, nftables
rules, except for an iptables-save file, and with --live a node without
the nftables mode's table.

--iif names the interface the packet arrives on (a pod's veth, the node's
uplink); without it the packet is sent by the node itself.`,
		Example: `  kproxy trace --dst 198.19.0.10:80                          # the example, from node-a itself
  kproxy trace --proxy-mode iptables --dst 127.0.0.1:30080   # the example's iptables rules
  kproxy trace --src 203.0.113.9 --iif eth0 --dst 198.19.200.1:443
  sudo kproxy trace --live --src 10.0.1.5 --iif veth1 --dst 10.96.0.10:53 --proto udp`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := completeOptions(cmd, o); err != nil {
				return err
			}
			return runTrace(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), o, tf)
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	fs := cmd.Flags()
	o.AddFlags(fs)
	config.AddKlogFlags(fs)
	fs.StringVarP(&tf.file, "filename", "f", "", "Cluster snapshot to render rules from (default: the built-in example).")
	fs.StringArrayVar(&tf.rules, "rules", nil, "File with rules: 'nft list ruleset', 'iptables-save' or 'kproxy render --proxy-mode ...' output; for ipvs mode also 'ipvsadm -S -n' (or -Ln) and 'ipset save' output (repeat --rules, or one file with all).")
	fs.BoolVar(&tf.live, "live", false, "Read the rules of this node's kernel (needs root, and nft or iptables).")
	fs.StringVar(&tf.src, "src", "", "Source address (default: the node's own address, or an outside address with --iif).")
	fs.StringVar(&tf.dst, "dst", "", "Destination IP:PORT (required).")
	fs.StringVar(&tf.proto, "proto", "tcp", "Protocol: tcp, udp or sctp.")
	fs.StringVar(&tf.iif, "iif", "", "Interface the packet arrives on; empty: sent by the node itself.")
	fs.StringSliceVar(&tf.local, "local-address", nil, "The node's own addresses (for 'fib ... type local'); default: from the snapshot's Node, or this host's with --live.")
	return cmd
}

func runTrace(ctx context.Context, out, errOut io.Writer, o *config.Options, tf traceFlags) error {
	dst, err := netip.ParseAddrPort(tf.dst)
	if err != nil {
		return usageError{fmt.Errorf("--dst: want IP:PORT: %w", err)}
	}
	proto := v1.Protocol(strings.ToUpper(tf.proto))
	if proto != model.TCP && proto != model.UDP && proto != model.SCTP {
		return usageError{fmt.Errorf("--proto: %q is not tcp, udp or sctp", tf.proto)}
	}
	var local []netip.Addr
	for _, s := range tf.local {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return usageError{fmt.Errorf("--local-address: %w", err)}
		}
		local = append(local, a)
	}

	if ipvsMode, err := traceIPVSMode(ctx, o, tf); err != nil {
		return err
	} else if ipvsMode {
		p := trace.Packet{Dst: dst.Addr(), Proto: proto, DstPort: dst.Port(), IIF: tf.iif}
		return runTraceIPVS(ctx, out, errOut, o, tf, p, local)
	}
	iptablesRules, err := traceIPTables(ctx, o, tf)
	if err != nil {
		return err
	}
	var text string
	switch {
	case iptablesRules:
		// handled below, per family
	case tf.live:
		var err error
		if text, err = liveRules(ctx, execer.OS{}, nftables.DefaultTableName); err != nil {
			return err
		}
	case len(tf.rules) > 0:
		b, err := readRules(tf.rules)
		if err != nil {
			return err
		}
		text = b
	default:
		snap, err := loadSnapshot(errOut, o, tf.file)
		if err != nil {
			return err
		}
		var b strings.Builder
		for _, st := range snap.States {
			opts := nftables.NewOptions(o.Config, st.Family)
			cfg := opts.RenderConfig(snap.Node, snap.LocalAddrs())
			in := &nftables.Input{State: st, NodeName: snap.NodeName, Zone: snap.Node.Zone(), Full: true, Changed: sets.New[model.ServicePortName](), Now: time.Time{}}
			b.WriteString(nftables.Render(cfg, in, nftables.NewApplied()).Tx.String())
		}
		text = b.String()
		if len(local) == 0 && snap.Node != nil {
			local = snap.Node.Addresses
		}
	}
	if tf.live && len(local) == 0 {
		if local, err = proxy.LocalAddrs(); err != nil {
			return err
		}
	}
	type tracer interface {
		Trace(trace.Packet, trace.Host) (*trace.Result, error)
	}
	var rs tracer
	if iptablesRules {
		if rs, local, err = iptablesRuleset(ctx, errOut, o, tf, dst.Addr(), local); err != nil {
			return err
		}
	} else if rs, err = trace.ParseNFT(text); err != nil {
		return fmt.Errorf("parsing the rules: %w", err)
	}

	src, err := traceSource(tf, dst.Addr(), local)
	if err != nil {
		return err
	}
	p := trace.Packet{Src: src.Addr(), Dst: dst.Addr(), Proto: proto, SrcPort: src.Port(), DstPort: dst.Port(), IIF: tf.iif}
	res, err := rs.Trace(p, trace.Host{LocalAddrs: local})
	if err != nil {
		return err
	}
	_, err = io.WriteString(out, res.String())
	return err
}

// traceSource picks the packet's source: --src (IP or IP:PORT), else the
// node's own address of the destination's family, else a documentation
// address standing for "somewhere outside".
func traceSource(tf traceFlags, dst netip.Addr, local []netip.Addr) (netip.AddrPort, error) {
	const port = 40000
	if tf.src != "" {
		if ap, err := netip.ParseAddrPort(tf.src); err == nil {
			return ap, nil
		}
		a, err := netip.ParseAddr(tf.src)
		if err != nil {
			return netip.AddrPort{}, usageError{fmt.Errorf("--src: want IP or IP:PORT: %w", err)}
		}
		return netip.AddrPortFrom(a, port), nil
	}
	if tf.iif == "" {
		for _, a := range local {
			if a.Is4() == dst.Is4() && !a.IsLoopback() {
				return netip.AddrPortFrom(a, port), nil
			}
		}
	}
	if dst.Is4() {
		return netip.AddrPortFrom(netip.MustParseAddr("203.0.113.9"), port), nil
	}
	return netip.AddrPortFrom(netip.MustParseAddr("2001:db8::9"), port), nil
}

func readFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	return string(b), nil
}

// liveRules lists our tables of both families ('nft list table' of the
// main table and of each of its shard tables): a service's dispatch is in
// its shard, the filter side and masquerading in the main table.
func liveRules(ctx context.Context, ex execer.Interface, main string) (string, error) {
	var text strings.Builder
	for _, fam := range []string{"ip", "ip6"} {
		out, err := ex.Run(ctx, []string{"nft", "list", "tables", fam}, "")
		if err != nil {
			return "", fmt.Errorf("reading the live rules: %w", err)
		}
		var tables []string
		for _, l := range strings.Split(out, "\n") {
			if name, ok := strings.CutPrefix(strings.TrimSpace(l), "table "+fam+" "); ok {
				tables = append(tables, name)
			}
		}
		slices.Sort(tables)
		for _, t := range nftables.OurTables(main, tables) {
			out, err := ex.Run(ctx, []string{"nft", "list", "table", fam, t}, "")
			if err != nil {
				return "", fmt.Errorf("reading the live rules: %w", err)
			}
			text.WriteString(out)
		}
	}
	return text.String(), nil
}
