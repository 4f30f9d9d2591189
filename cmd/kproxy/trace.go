package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"

	"github.com/spf13/cobra"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/trace"
	"github.com/kproxy/kproxy/internal/trace/node"
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
		Short: "Show where a packet goes through kproxy's nftables, iptables or ipvs mode's rules",
		Long: `trace walks one new connection through kproxy's rules and prints
every chain and rule it meets and where it ends: which endpoint it is DNATed
to (every possible one, with its probability), whether it is masqueraded,
dropped or rejected.

The rules come from one of:
  --live         this node's kernel ('nft list table ip|ip6 kube-proxy';
                 iptables-save of the backend kproxy would choose; in ipvs
                 mode also the IPVS table and the ipsets; root)
  --rules FILE   a saved 'nft list ruleset', 'iptables-save' or 'kproxy
                 render' output (iptables-save syntax is recognised); for
                 ipvs mode also 'ipvsadm -S -n' and 'ipset save' output
  -f FILE        a cluster snapshot, rendered as 'kproxy render --proxy-mode
                 nftables|iptables|ipvs' would (the built-in example when
                 none of these is given); takes render's flags
                 (--hostname-override, ...)

Which rules: --proxy-mode nftables, iptables or ipvs says; without it,
nftables rules, except for an iptables-save file (iptables mode) or one
with ipvsadm or ipset lines (ipvs mode), and with --live a node without
the nftables mode's table (ipvs mode where kube-ipvs0 exists, else
iptables mode).

In ipvs mode the packet walks the iptables chains with their ipset
matches, then the IPVS table where the kernel consults it: the virtual
server, its scheduler and each real server with its weight.

The Service port a packet is for is named in iptables mode by the rules'
comments, in nftables mode after each step taken for it ("(service
ns/name:port/TCP)", from the comment of the map element that dispatched
the packet); ipvs mode's virtual servers and ipsets carry no name.

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
	p := trace.Packet{Dst: dst.Addr(), Proto: proto, DstPort: dst.Port(), IIF: tf.iif}
	if tf.src != "" {
		src, err := netip.ParseAddrPort(tf.src)
		if err != nil {
			a, err := netip.ParseAddr(tf.src)
			if err != nil {
				return usageError{fmt.Errorf("--src: want IP or IP:PORT: %w", err)}
			}
			src = netip.AddrPortFrom(a, node.DefaultSrcPort)
		}
		p.Src, p.SrcPort = src.Addr(), src.Port()
	}
	res, err := node.Trace(ctx, node.Request{
		Mode: string(o.Config.Mode), Rules: tf.rules, Live: tf.live, IPTablesMode: o.IPTablesMode,
		Render: func(mode string, fam v1.IPFamily, local []netip.Addr) (*node.Rendered, error) {
			snap, err := loadSnapshot(errOut, o, tf.file)
			if err != nil {
				return nil, err
			}
			return snap.ForTrace(o.Config, mode, fam, local)
		},
		Packet: p, Local: local, Log: errOut,
	})
	if errors.Is(err, node.ErrMode) {
		return usageError{err}
	}
	if err != nil {
		return err
	}
	_, err = io.WriteString(out, res.String())
	return err
}
