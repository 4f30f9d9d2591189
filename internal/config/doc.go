// Package config builds kproxy's effective configuration: the upstream
// KubeProxyConfiguration type (kubeproxy.config.k8s.io/v1alpha1), filled from
// kube-proxy-compatible command line flags or from a --config file, defaulted
// and validated the way kube-proxy v1.37 does it.
//
// # Precedence between --config and flags
//
// kproxy follows upstream kube-proxy (cmd/kube-proxy/app/options.go), which
// does NOT merge the two sources field by field:
//
//   - Without --config, the configuration comes from the flags. Every flag
//     starts at its upstream default, so an unset flag means "default".
//   - With --config, the file replaces the flag-built configuration as a whole.
//     Flags that map onto KubeProxyConfiguration fields (--proxy-mode,
//     --cluster-cidr, --kubeconfig, --feature-gates, --iptables-*, --ipvs-*,
//     --conntrack-*, ...) are ignored, even when given explicitly; fields the
//     file leaves out get their defaults, not the flag values. Options.Warnings
//     names every such ignored flag, because upstream drops them silently.
//   - Exceptions that still win over the file:
//     --hostname-override (trimmed, lower-cased; all-blank is an error), and
//     the logging flags -v, --vmodule, --logging-format,
//     --log-flush-frequency and --log-{text,json}-{split-stream,
//     info-buffer-size}: a changed flag overrides the file's logging value;
//     --vmodule entries are put in front of the file's entries so they win.
//   - Flags that are not configuration fields apply in both cases: --master,
//     --cleanup, --init-only, --write-config-to.
//   - The deprecated --healthz-port and --metrics-port only apply without
//     --config and without --write-config-to (port 0 disables the server).
//
// Mode-specific fields follow upstream's v1alpha1 conversion: the sync periods
// used are those of the effective mode's section (iptables for "" and
// "iptables", ipvs, nftables), and so is masqueradeAll (nftables section in
// nftables mode, iptables section otherwise). On the command line,
// --iptables-sync-period and --iptables-min-sync-period feed the iptables and
// the nftables modes, --ipvs-*-sync-period the ipvs mode, and --masquerade-all
// every mode. --iptables-masquerade-bit is used by the iptables and ipvs modes
// only: nftables mode reads nftables.masqueradeBit, which has no flag. Use
// SyncPeriods, MasqueradeAll and MasqueradeBit to read the values the chosen
// mode will really use.
//
// An empty mode stays empty in the effective configuration (so a defaulted
// mode can be told apart from an explicit one); EffectiveMode maps it to
// "iptables", the Linux default in v1.37.
//
// # Using it
//
//	o := config.NewOptions()
//	o.AddFlags(cmd.Flags())
//	config.AddKlogFlags(cmd.Flags())
//	// after parsing:
//	err := o.Complete(cmd.Flags(), os.Getenv) // then o.Validate()
//	for _, w := range o.Warnings() { klog.InfoS("Configuration warning", "warning", w) }
//	config.ApplyLogging(o.Config) // verbosity/vmodule from a config file
//
// The IPTABLES_MODE environment variable ("", "legacy" or "nft", as in the
// k3s/RKE2 images) picks the iptables backend; it is read by Options.Complete.
package config
