package config

import (
	"fmt"
	"sort"

	"github.com/spf13/pflag"
	"k8s.io/kube-proxy/config/v1alpha1"
)

// Warnings lists settings that are accepted but have no effect, or that the
// operator should know about, for the effective configuration. Upstream drops
// most of these silently; kproxy's command should log each one at startup.
// Call it after Complete.
func (o *Options) Warnings() []string {
	if !o.completed {
		return nil
	}
	var w []string
	w = append(w, o.fileWarnings...)
	if o.fs != nil {
		if o.ConfigFile != "" {
			w = append(w, ignoredFlagWarnings(o.fs, o.ConfigFile)...)
		} else {
			w = append(w, flagModeWarnings(o.fs, o.Config)...)
		}
	}
	if o.ConfigFile != "" {
		w = append(w, fileModeWarnings(o.Config)...)
	}
	w = append(w, configWarnings(o.Config, o.IPTablesMode)...)
	return w
}

// ignoredFlagWarnings names the configuration flags given together with
// --config, which upstream ignores without a word.
func ignoredFlagWarnings(fs *pflag.FlagSet, file string) []string {
	var w []string
	fs.Visit(func(f *pflag.Flag) {
		if configFieldFlags[f.Name] {
			w = append(w, fmt.Sprintf("--%s is ignored because --config %s is set; the config file (or its default) takes precedence", f.Name, file))
		}
	})
	return w
}

// flagModeWarnings names explicitly set flags that the effective proxy mode
// or local-traffic detection mode does not use.
func flagModeWarnings(fs *pflag.FlagSet, c *v1alpha1.KubeProxyConfiguration) []string {
	mode := EffectiveMode(c)
	var w []string
	fs.Visit(func(f *pflag.Flag) {
		why := ""
		switch f.Name {
		case "ipvs-sync-period", "ipvs-min-sync-period", "ipvs-scheduler", "ipvs-exclude-cidrs",
			"ipvs-strict-arp", "ipvs-tcp-timeout", "ipvs-tcpfin-timeout", "ipvs-udp-timeout":
			if mode != ModeIPVS {
				why = "--proxy-mode is " + mode
			}
		case "iptables-sync-period", "iptables-min-sync-period":
			// iptables and nftables modes take their sync periods from
			// these flags; ipvs mode from --ipvs-*-sync-period.
			if mode == ModeIPVS {
				why = "--proxy-mode is ipvs (use --ipvs-sync-period / --ipvs-min-sync-period)"
			}
		case "iptables-masquerade-bit":
			// nftables mode uses nftables.masqueradeBit, which has no flag.
			if mode == ModeNFTables {
				why = "--proxy-mode is nftables, which uses nftables.masqueradeBit (settable only in a config file)"
			}
		case "iptables-localhost-nodeports":
			if mode != ModeIPTables {
				why = "--proxy-mode is " + mode + " (localhost NodePorts exist only in iptables mode)"
			}
		case "pod-bridge-interface":
			if c.DetectLocalMode != LocalModeBridgeInterface {
				why = "--detect-local-mode is " + string(c.DetectLocalMode)
			}
		case "pod-interface-name-prefix":
			if c.DetectLocalMode != LocalModeInterfaceNamePrefix {
				why = "--detect-local-mode is " + string(c.DetectLocalMode)
			}
		case "cluster-cidr":
			if c.DetectLocalMode != LocalModeClusterCIDR {
				why = "--detect-local-mode is " + string(c.DetectLocalMode)
			}
		}
		if why != "" {
			w = append(w, fmt.Sprintf("--%s is set but %s; it has no effect", f.Name, why))
		}
	})
	return w
}

// fileModeWarnings is flagModeWarnings for a config file: fields set to a
// non-default value in a section the effective mode does not read.
func fileModeWarnings(c *v1alpha1.KubeProxyConfiguration) []string {
	mode := EffectiveMode(c)
	var w []string
	add := func(field, why string) {
		w = append(w, fmt.Sprintf("config field %s is set but %s; it has no effect", field, why))
	}
	if mode != ModeIPVS {
		ipvs := c.IPVS
		set := map[string]bool{
			"ipvs.scheduler":     ipvs.Scheduler != "",
			"ipvs.excludeCIDRs":  len(ipvs.ExcludeCIDRs) > 0,
			"ipvs.strictARP":     ipvs.StrictARP,
			"ipvs.tcpTimeout":    ipvs.TCPTimeout.Duration != 0,
			"ipvs.tcpFinTimeout": ipvs.TCPFinTimeout.Duration != 0,
			"ipvs.udpTimeout":    ipvs.UDPTimeout.Duration != 0,
		}
		var names []string
		for name, isSet := range set {
			if isSet {
				names = append(names, name)
			}
		}
		sort.Strings(names)
		for _, name := range names {
			add(name, "mode is "+mode)
		}
	}
	if mode != ModeNFTables && c.NFTables.MasqueradeAll {
		add("nftables.masqueradeAll", "mode is "+mode+" (it reads iptables.masqueradeAll)")
	}
	if mode == ModeNFTables && c.IPTables.MasqueradeAll {
		add("iptables.masqueradeAll", "mode is nftables (it reads nftables.masqueradeAll)")
	}
	if c.DetectLocal.BridgeInterface != "" && c.DetectLocalMode != LocalModeBridgeInterface {
		add("detectLocal.bridgeInterface", "detectLocalMode is "+string(c.DetectLocalMode))
	}
	if c.DetectLocal.InterfaceNamePrefix != "" && c.DetectLocalMode != LocalModeInterfaceNamePrefix {
		add("detectLocal.interfaceNamePrefix", "detectLocalMode is "+string(c.DetectLocalMode))
	}
	if c.ClusterCIDR != "" && c.DetectLocalMode != LocalModeClusterCIDR {
		add("clusterCIDR", "detectLocalMode is "+string(c.DetectLocalMode))
	}
	return w
}

// configWarnings are about the effective configuration, wherever it came
// from.
func configWarnings(c *v1alpha1.KubeProxyConfiguration, iptablesMode string) []string {
	var w []string
	switch c.Mode {
	case "":
		// KEP-5343: the default is to become nftables; v1.37 starts warning
		// when the mode is left to the default.
		w = append(w, "proxy mode is not set, using iptables; the default is planned to change to nftables in a future release, set --proxy-mode (or mode) explicitly")
	case ModeIPVS:
		w = append(w, "ipvs proxy mode is deprecated (gated by the KubeProxyIPVS feature gate); consider nftables mode")
	}
	if c.DetectLocalMode == LocalModeClusterCIDR && c.ClusterCIDR == "" {
		w = append(w, "detectLocalMode is ClusterCIDR but clusterCIDR is empty: no traffic is treated as coming from pods of this cluster")
	}
	if iptablesMode != IPTablesModeAuto && EffectiveMode(c) == ModeNFTables {
		w = append(w, fmt.Sprintf("IPTABLES_MODE=%s only selects the iptables backend, used in nftables mode only to clean up rules of other modes", iptablesMode))
	}
	return w
}
