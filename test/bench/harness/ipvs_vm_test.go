package harness

import (
	"encoding/json"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/testutil/vm"
	"github.com/kproxy/kproxy/test/bench/cluster"
)

// ipvsBenchModules are what ipvs mode needs, loaded up front in the VM.
var ipvsBenchModules = []string{
	"ip_vs", "ip_vs_rr", "dummy", "ip_set", "ip_set_hash_ip", "ip_set_hash_ipport", "ip_set_hash_ipportip",
	"ip_set_hash_ipportnet", "ip_set_hash_net", "ip_set_bitmap_port", "xt_set", "ip_tables", "iptable_nat",
	"iptable_filter", "ip6_tables", "ip6table_nat", "ip6table_filter", "xt_comment", "xt_mark", "xt_conntrack",
	"xt_addrtype", "xt_MASQUERADE", "xt_nat", "xt_tcpudp", "ipt_REJECT", "ip6t_REJECT", "xt_ipvs", "xt_physdev",
}

// TestIPVSBench measures ipvs mode with the file source inside the test
// VM (this host's kernel has no IPVS): the first sync and the typical
// changes of the file-source run, at the service counts of
// KPROXY_IPVS_BENCH (e.g. "1000,10000"; skipped without it: a
// measurement, not part of the suite), plain ClusterIP services × 10
// endpoints, KPROXY_IPVS_BENCH_REPS repetitions (default 3),
// KPROXY_IPVS_BENCH_CHANGES of each kind of change. The VM's CPU
// is emulated (TCG): its figures compare with each other, not with the
// host's. The report (markdown, then report.json's content) is in the
// test's log: the guest cannot write to the host.
//
//	KPROXY_IPVS_BENCH=1000,10000 go test -count=1 -timeout 90m -run '^TestIPVSBench$' -v ./test/bench/harness
func TestIPVSBench(t *testing.T) {
	spec := os.Getenv("KPROXY_IPVS_BENCH")
	if spec == "" {
		t.Skip("KPROXY_IPVS_BENCH=<service counts> runs it")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces")
	}
	if !vm.InVM() {
		if ok, why := vm.Available(); !ok {
			t.Fatalf("no test VM: %s", why)
		}
		kproxy := buildKproxy(t)
		defer func(m []string) { vm.DefaultModules = m }(vm.DefaultModules)
		vm.DefaultModules = append(slices.Clone(vm.DefaultModules), ipvsBenchModules...)
		defer func(d time.Duration) { vm.TestTimeout = d }(vm.TestTimeout)
		vm.TestTimeout = 80 * time.Minute
		env := []string{"KPROXY_IPVS_BENCH=" + spec, "KPROXY_IPVS_BENCH_KPROXY=" + kproxy}
		for _, k := range []string{"KPROXY_IPVS_BENCH_REPS", "KPROXY_IPVS_BENCH_MODES", "KPROXY_IPVS_BENCH_CHANGES"} {
			if v := os.Getenv(k); v != "" {
				env = append(env, k+"="+v)
			}
		}
		vm.RunTestInVM(t, "^TestIPVSBench$", env...)
		return
	}
	// Under emulation 10k services take minutes to read and program.
	firstSyncLimit = 40 * time.Minute
	cfg := Config{Mix: cluster.Plain, Seed: 1, Reps: 3, Modes: []string{"ipvs-legacy"}, FileSource: true,
		Proxies: []Proxy{{Name: "kproxy", Bin: os.Getenv("KPROXY_IPVS_BENCH_KPROXY")}}}
	for _, s := range strings.Split(spec, ",") {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("KPROXY_IPVS_BENCH: %q is not a count", s)
		}
		cfg.Services = append(cfg.Services, n)
	}
	if r, err := strconv.Atoi(os.Getenv("KPROXY_IPVS_BENCH_REPS")); err == nil {
		cfg.Reps = r
	}
	if n, err := strconv.Atoi(os.Getenv("KPROXY_IPVS_BENCH_CHANGES")); err == nil {
		cfg.FileChanges = n // of each kind (default 5 flips, 3 of the others)
	}
	if m := os.Getenv("KPROXY_IPVS_BENCH_MODES"); m != "" {
		cfg.Modes = strings.Split(m, ",")
	}
	r := runConfig(t, cfg)
	if len(r.Errors) > 0 {
		t.Errorf("runs failed: %v", r.Errors)
	}
	var md strings.Builder
	Markdown(&md, r)
	t.Logf("report (emulated CPU, TCG):\n%s", md.String())
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("report.json: %s", data)
}
