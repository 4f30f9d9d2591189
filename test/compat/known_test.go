package compat

// intended lists the differences kproxy keeps on purpose, with the reason;
// this is the only place they are listed (docs/compatibility.md shows the
// reason). Keys are "<kind> <item>" as the subtests print them.
var intended = map[string]string{
	"Flag --from-file":               "kproxy only: read Services, EndpointSlices and Nodes from a file instead of the API server (render, tests, disaster recovery)",
	"Flag --iptables-compact-layout": "kproxy only: opt-in iptables layout without KUBE-SEP chains; default is upstream's layout",

	// kproxy's own metrics, in addition to upstream's.
	"Metric kproxy_info":                                         "kproxy only: version, mode and iptables backend in use",
	"Metric kproxy_contested_addresses":                          "kproxy only: addresses claimed by more than one Service (resolved deterministically)",
	"Metric kproxy_iptables_lock_wait_seconds":                   "kproxy only: time waiting for the xtables lock",
	"Metric kproxy_iptables_other_backend_chains":                "kproxy only: KUBE chains found in the iptables backend not in use",
	"Metric kproxy_refused_service_ports":                        "kproxy only: service ports refused as invalid (named in the log)",
	"Metric kproxy_source_file_last_good_read_timestamp_seconds": "kproxy only: --from-file source freshness",
}

// newFinding marks differences this suite found that no item of issue 13
// names yet: they need an owner who fixes them or moves them to intended.
const newFinding = 0

// pendingFixes lists differences that an item of issue 13 is fixing, with
// the item number: their subtests log instead of failing. An exact entry
// that matches upstream fails, so the list shrinks as fixes merge. "<kind> *"
// covers every item of a kind.
var pendingFixes = map[string]int{
	// Item 2: --version is a subcommand only.
	"Flag --version": 2,
	// Item 6: kproxy knows about 14 gates; upstream accepts every
	// Kubernetes gate and refuses removed ones.
	"Feature gate *": 6,
	// klog's legacy flags, removed from kube-proxy in v1.26, are still
	// registered by kproxy (config.AddKlogFlags); --vmodule's type name
	// differs with them.
	"Flag --add_dir_header":                   newFinding,
	"Flag --alsologtostderr":                  newFinding,
	"Flag --alsologtostderrthreshold":         newFinding,
	"Flag --legacy_stderr_threshold_behavior": newFinding,
	"Flag --log_backtrace_at":                 newFinding,
	"Flag --log_dir":                          newFinding,
	"Flag --log_file":                         newFinding,
	"Flag --log_file_max_size":                newFinding,
	"Flag --logtostderr":                      newFinding,
	"Flag --one_output":                       newFinding,
	"Flag --skip_headers":                     newFinding,
	"Flag --skip_log_headers":                 newFinding,
	"Flag --stderrthreshold":                  newFinding,
	"Flag --vmodule":                          newFinding,

	// Item 5: component-base metrics (rest_client_*, kubernetes_build_info,
	// kubernetes_feature_enabled, registered_metrics_total, Go runtime
	// metrics, ...) and /metrics/slis, /flagz, /statusz.
	"Metric *":                         5,
	"HTTP endpoint 10249/flagz":        5,
	"HTTP endpoint 10249/metrics/slis": 5,
	"HTTP endpoint 10249/statusz":      5,
	// Upstream registers this histogram only once its conntrack reconciler
	// ran; kproxy at start.
	"Metric kubeproxy_conntrack_reconciler_sync_duration_seconds": newFinding,
	// Upstream's nfacct counters (iptables mode) have no kproxy
	// counterpart.
	"Metric kubeproxy_iptables_ct_state_invalid_dropped_packets_total":     newFinding,
	"Metric kubeproxy_iptables_localhost_nodeports_accepted_packets_total": newFinding,

	// Item 1: conntrack sysctls are never written.
	"Sysctl (--init-only) net.netfilter.nf_conntrack_tcp_timeout_close_wait":  1,
	"Sysctl (--init-only) net.netfilter.nf_conntrack_tcp_timeout_established": 1,

	// Item 9: /healthz says nodeEligible true, 200, for a Node never seen.
	"HTTP endpoint 10256/healthz (Node missing)": 9,
	// Item 9: no Events are recorded.
	"Event Starting": 9,

	// Item 9: /configz shows mode "" and nodePortAddresses null where
	// upstream shows the defaulted values.
	"Config field kubeadm-iptables/mode":              9,
	"Config field kubeadm-nftables/nodePortAddresses": 9,
	"Config field unknown-fields/nodePortAddresses":   9,
	"Config field duplicate-fields/nodePortAddresses": 9,
	// /configz: upstream leaves the sync periods of the modes not in use
	// at 0s; kproxy defaults every mode's section (same /configz area as
	// item 9, not named there).
	"Config field kubeadm-iptables/ipvs.syncPeriod":        newFinding,
	"Config field kubeadm-iptables/nftables.minSyncPeriod": newFinding,
	"Config field kubeadm-iptables/nftables.syncPeriod":    newFinding,
	"Config field rke2-flags/ipvs.syncPeriod":              newFinding,
	"Config field rke2-flags/nftables.minSyncPeriod":       newFinding,
	"Config field rke2-flags/nftables.syncPeriod":          newFinding,
	"Config field kubeadm-nftables/iptables.minSyncPeriod": newFinding,
	"Config field kubeadm-nftables/iptables.syncPeriod":    newFinding,
	"Config field kubeadm-nftables/ipvs.syncPeriod":        newFinding,
	"Config field unknown-fields/iptables.minSyncPeriod":   newFinding,
	"Config field unknown-fields/iptables.syncPeriod":      newFinding,
	"Config field unknown-fields/ipvs.syncPeriod":          newFinding,
	"Config field duplicate-fields/iptables.minSyncPeriod": newFinding,
	"Config field duplicate-fields/iptables.syncPeriod":    newFinding,
	"Config field duplicate-fields/ipvs.syncPeriod":        newFinding,
}
