package harness

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/test/bench/cluster"
	"github.com/kproxy/kproxy/test/e2e/framework"
)

// testLog sends the harness's progress to t.Log.
type testLog struct{ t testing.TB }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// buildKproxy builds kproxy from this checkout into a temporary
// directory.
func buildKproxy(t *testing.T) string {
	t.Helper()
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	kproxy := filepath.Join(t.TempDir(), "kproxy")
	build := exec.Command("go", "build", "-o", kproxy, "./cmd/kproxy")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return kproxy
}

// runConfig validates cfg and runs it, its progress in t's log; the
// caller judges the report's Errors.
func runConfig(t *testing.T, cfg Config) *Report {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	tb := NewTB(context.Background(), testLog{t}, t.Name())
	var r *Report
	if err := tb.Scope("run", func(tb *TB) { r = Run(tb, cfg) }); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestShortRun is the benchmark at 100 services, one repetition, kproxy
// and upstream kube-proxy in nftables mode: the file source, the API
// server and the data plane, so that the harness cannot rot. It needs
// root and the control-plane binaries (KPROXY_E2E=1 makes their absence a
// failure, as for test/e2e). About a minute.
func TestShortRun(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces")
	}
	if reason := framework.SkipReason(); reason != "" {
		if framework.Mandatory() {
			t.Fatalf("%s=1 but: %s", framework.EnvRun, reason)
		}
		t.Skip(reason)
	}
	binDir, err := framework.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	upstream := filepath.Join(binDir, "kube-proxy")
	if _, err := os.Stat(upstream); err != nil {
		if framework.Mandatory() {
			t.Fatalf("upstream kube-proxy: %v (test/tools/build.sh builds it)", err)
		}
		t.Skipf("upstream kube-proxy: %v", err)
	}
	kproxy := buildKproxy(t)

	cfg := Config{
		Services: []int{100}, Mix: cluster.Realistic, Seed: 1, Modes: []string{"nftables"}, Reps: 1,
		Proxies:    []Proxy{{Name: "kproxy", Bin: kproxy}, {Name: "upstream", Bin: upstream}},
		FileSource: true, APIServer: true, DataPlane: true, Changes: 2, FileChanges: 1, Quick: true,
		Soak: 40, SoakFor: 4 * time.Second, SoakProxies: []string{"kproxy"},
		LogDir: t.TempDir(), SoakProfile: t.TempDir(),
	}
	r := runConfig(t, cfg)
	if len(r.Errors) > 0 {
		t.Fatalf("runs failed: %v", r.Errors)
	}

	if len(r.File) != 1 {
		t.Fatalf("%d file-source results, want 1", len(r.File))
	}
	f := r.File[0]
	if f.FirstSync.Seconds <= 0 || f.FirstSync.Render <= 0 || f.FirstSync.Kernel <= 0 || f.FirstSync.Bytes <= 0 || f.RSSSteadyMiB <= 0 || f.HeapMiB <= 0 {
		t.Errorf("file source: a figure of the first sync is missing: %+v", f)
	}
	kinds := map[string]bool{}
	for _, c := range f.Changes {
		kinds[c.Kind] = true
		if len(c.Syncs) == 0 || c.First <= 0 {
			t.Errorf("change %q: no sync read from the log", c.Name)
		}
	}
	for _, fc := range fileChanges {
		if !kinds[fc.kind] {
			t.Errorf("no %s change measured", fc.kind)
		}
	}

	if len(r.API) != 2 {
		t.Fatalf("%d API server results, want kproxy's and upstream's", len(r.API))
	}
	for _, a := range r.API {
		if a.TimeToFirstSync <= 0 || a.FirstSyncSeconds <= 0 || a.CPUToFirstSync <= 0 || a.RSSSteadyMiB <= 0 {
			t.Errorf("%s: a figure of the first sync is missing: %+v", a.Proxy, a)
		}
		if len(a.NPL) != cfg.Changes || len(a.ChangeSync) != cfg.Changes {
			t.Errorf("%s: %d network programming samples and %d change syncs, want %d each", a.Proxy, len(a.NPL), len(a.ChangeSync), cfg.Changes)
		}
		if len(a.DataPlane) != 3 {
			t.Errorf("%s: %d data plane probes, want first, middle, last", a.Proxy, len(a.DataPlane))
		}
		for _, p := range a.DataPlane {
			if p.Errors > 0 || p.Conns != probeConns || p.P50us <= 0 {
				t.Errorf("%s: probe %+v: connections failed", a.Proxy, p)
			}
		}
	}

	if len(r.Soak) != 1 {
		t.Fatalf("%d soak results, want kproxy's", len(r.Soak))
	}
	if s := r.Soak[0]; s.Changes != cfg.Soak || s.RSSSettledMiB <= 0 || s.RSSEndMiB <= 0 || s.HeapEndMiB <= 0 || s.NPLs <= 0 || s.Syncs <= 0 || len(s.Samples) < 2 {
		t.Errorf("soak: a figure is missing: %+v", s)
	}

	for _, name := range []string{"soak-kproxy-nftables.pprof", "soak-kproxy-nftables-heap-settled.pprof", "soak-kproxy-nftables-heap-end.pprof", "soak-kproxy-nftables-heap-end.txt"} {
		if fi, err := os.Stat(filepath.Join(cfg.SoakProfile, name)); err != nil || fi.Size() == 0 {
			t.Errorf("soak profile %s missing or empty (%v)", name, err)
		}
	}

	// Every proxy the run started left its log, one directory per run:
	// file source, each proxy against the API server, the soak.
	logs, _ := filepath.Glob(filepath.Join(cfg.LogDir, "*", "*.log"))
	if len(logs) != 4 {
		t.Errorf("kept logs %v, want 4 (file source, kproxy, upstream, soak)", logs)
	}
	for _, l := range logs {
		if data, err := os.ReadFile(l); err != nil || len(data) == 0 {
			t.Errorf("log %s empty or unreadable (%v)", l, err)
		}
	}

	out := t.TempDir()
	if err := WriteReport(out, r); err != nil {
		t.Fatal(err)
	}
	var back Report
	data, err := os.ReadFile(filepath.Join(out, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &back); err != nil || len(back.API) != 2 {
		t.Errorf("report.json does not read back (%v)", err)
	}
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	if err != nil || !strings.Contains(string(md), "| time to first sync (s) |") || !strings.Contains(string(md), "| 100 (") {
		t.Errorf("report.md lacks the tables (%v):\n%s", err, md)
	}
	if data, err := os.ReadFile(filepath.Join(out, "soak.svg")); err != nil || xml.Unmarshal(data, new(struct{})) != nil || !strings.Contains(string(data), "<polyline") {
		t.Errorf("soak plot missing or not an SVG with a line (%v)", err)
	}
	for _, name := range []string{"sync", "cpu", "npl", "memory", "connect", "file-sync"} {
		data, err := os.ReadFile(filepath.Join(out, name+".svg"))
		if err != nil {
			t.Errorf("plot %s: %v", name, err)
			continue
		}
		if err := xml.Unmarshal(data, new(struct{})); err != nil || !strings.Contains(string(data), "<circle") {
			t.Errorf("plot %s is not an SVG with points (%v)", name, err)
		}
	}
	t.Logf("report:\n%s", md)
}
