package compat

// intended lists the differences kproxy keeps on purpose, with the reason;
// this is the only place they are listed (docs/compatibility.md shows the
// reason). Keys are "<kind> <item>" as the subtests print them.
var intended = map[string]string{
	"Flag --from-file":               "kproxy only: read Services, EndpointSlices and Nodes from a file instead of the API server (render, tests, disaster recovery)",
	"Flag --iptables-compact-layout": "kproxy only: opt-in iptables layout without KUBE-SEP chains; default is upstream's layout",
	"Flag --vmodule":                 "klog's own flag type (moduleSpec) where upstream wraps it in component-base's (pattern=N,...): the same values are accepted",

	// kproxy's own metrics, in addition to upstream's.
	"Metric kproxy_info":                                                  "kproxy only: version, mode and iptables backend in use",
	"Metric kproxy_contested_addresses":                                   "kproxy only: addresses claimed by more than one Service (resolved deterministically)",
	"Metric kproxy_iptables_lock_wait_seconds":                            "kproxy only: time waiting for the xtables lock",
	"Metric kproxy_iptables_other_backend_chains":                         "kproxy only: KUBE chains found in the iptables backend not in use",
	"Metric kproxy_refused_service_ports":                                 "kproxy only: service ports refused as invalid (named in the log)",
	"Metric kproxy_source_file_last_good_read_timestamp_seconds":          "kproxy only: --from-file source freshness",
	"Metric aggregator_discovery_aggregation_count_total":                 "upstream links k8s.io/apiserver, whose packages register it; nothing in kube-proxy updates it, and kproxy does not link k8s.io/apiserver (it would double the binary)",
	"Metric apiserver_audit_event_total":                                  "upstream links k8s.io/apiserver, whose packages register it; nothing in kube-proxy updates it, and kproxy does not link k8s.io/apiserver (it would double the binary)",
	"Metric apiserver_audit_requests_rejected_total":                      "upstream links k8s.io/apiserver, whose packages register it; nothing in kube-proxy updates it, and kproxy does not link k8s.io/apiserver (it would double the binary)",
	"Metric apiserver_envelope_encryption_dek_cache_fill_percent":         "upstream links k8s.io/apiserver, whose packages register it; nothing in kube-proxy updates it, and kproxy does not link k8s.io/apiserver (it would double the binary)",
	"Metric apiserver_storage_data_key_generation_duration_seconds":       "upstream links k8s.io/apiserver, whose packages register it; nothing in kube-proxy updates it, and kproxy does not link k8s.io/apiserver (it would double the binary)",
	"Metric apiserver_storage_data_key_generation_failures_total":         "upstream links k8s.io/apiserver, whose packages register it; nothing in kube-proxy updates it, and kproxy does not link k8s.io/apiserver (it would double the binary)",
	"Metric apiserver_storage_envelope_transformation_cache_misses_total": "upstream links k8s.io/apiserver, whose packages register it; nothing in kube-proxy updates it, and kproxy does not link k8s.io/apiserver (it would double the binary)",
	"Metric apiserver_validation_declarative_validation_mismatch_total":   "upstream links k8s.io/apiserver, whose packages register it; nothing in kube-proxy updates it, and kproxy does not link k8s.io/apiserver (it would double the binary)",
	"Metric apiserver_validation_declarative_validation_panic_total":      "upstream links k8s.io/apiserver, whose packages register it; nothing in kube-proxy updates it, and kproxy does not link k8s.io/apiserver (it would double the binary)",
	"Metric apiserver_validation_duplicate_validation_error_total":        "upstream links k8s.io/apiserver, whose packages register it; nothing in kube-proxy updates it, and kproxy does not link k8s.io/apiserver (it would double the binary)",
	"Metric apiserver_webhooks_x509_insecure_sha1_total":                  "upstream links k8s.io/apiserver, whose packages register it; nothing in kube-proxy updates it, and kproxy does not link k8s.io/apiserver (it would double the binary)",
	"Metric apiserver_webhooks_x509_missing_san_total":                    "upstream links k8s.io/apiserver, whose packages register it; nothing in kube-proxy updates it, and kproxy does not link k8s.io/apiserver (it would double the binary)",
	"Metric kproxy_service_ports":                                         "kproxy only: service ports the last successful sync programmed",
	"Event KubeProxyDefaultMode":                                          "upstream records it before its event broadcaster starts sending, so it never reaches the API server; kproxy sends it (Warning, when no mode is configured)",
}

// newFinding marks differences this suite found that no planned fix
// names yet: they need an owner who fixes them or moves them to intended.
const newFinding = 0

// pendingFixes lists differences whose fix is under way, each with the
// number of its work item: their subtests log instead of failing. An exact entry
// that matches upstream fails, so the list shrinks as fixes merge. "<kind> *"
// covers every item of a kind.
var pendingFixes = map[string]int{}
