package compat

// intended lists the differences kproxy keeps on purpose, with the reason;
// this is the only place they are listed (docs/compatibility.md shows the
// reason). Keys are "<kind> <item>" as the subtests print them.
var intended = map[string]string{
	"Flag --from-file":               "kproxy only: read Services, EndpointSlices and Nodes from a file instead of the API server (render, tests, disaster recovery)",
	"Flag --iptables-compact-layout": "kproxy only: opt-in iptables layout without KUBE-SEP chains; default is upstream's layout",
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
}
