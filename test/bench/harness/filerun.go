package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/kproxy/kproxy/test/bench/cluster"
	"github.com/kproxy/kproxy/test/e2e/framework"
)

// FileResult is one run of kproxy with the file source in a fresh
// namespace: its first sync, then typical changes one at a time and a
// burst, each change's syncs with their phases, and its memory.
type FileResult struct {
	Services  int    `json:"services"`
	Endpoints int    `json:"endpoints"`
	Mix       string `json:"mix"`
	Mode      string `json:"mode"`
	Rep       int    `json:"rep"`
	// TimeToFirstSync is from start to the first sync's end, reading the
	// file included; FirstSync is that sync itself, phase by phase.
	TimeToFirstSync float64 `json:"timeToFirstSync"`
	FirstSync       Sync    `json:"firstSync"`
	// CPUToFirstSync: user+system CPU seconds of the process when the
	// first sync was seen (the kernel's commit runs in its sendmsg).
	CPUToFirstSync float64 `json:"cpuToFirstSync"`
	// RSS after the first sync settled (3 s), its peak so far (VmHWM),
	// the Go heap in use then, and RSS and peak after every change.
	RSSSteadyMiB float64        `json:"rssSteadyMiB"`
	RSSPeakMiB   float64        `json:"rssPeakMiB"`
	HeapMiB      float64        `json:"heapInuseMiB"`
	RSSEndMiB    float64        `json:"rssEndMiB"`
	RSSPeakEnd   float64        `json:"rssPeakEndMiB"`
	Changes      []ChangeResult `json:"changes"`
	// Error says why the changes stopped early, if they did.
	Error string `json:"error,omitempty"`
}

// ChangeResult is one change: the syncs that followed it (the first
// delivers it; kproxy's nftables mode deletes what it shadowed in a
// clean-up sync a second later).
type ChangeResult struct {
	Kind      string  `json:"kind"`
	Name      string  `json:"name"`
	Endpoints int     `json:"endpoints"`
	Syncs     []Sync  `json:"syncs"`
	First     float64 `json:"firstSyncSeconds"`
	Total     float64 `json:"totalSyncSeconds"`
}

// The typical changes measured, in order, and how many of each.
var fileChanges = []struct {
	kind  string
	times int
}{
	{"endpoint-ready-flip", 5}, {"pod-rescheduled", 3}, {"service-added", 3},
	{"service-removed", 3}, {"rollout-50", 1}, {"burst-1000", 1},
}

// firstSyncLimit, when set, replaces the file-source run's 10 minutes for
// the first sync (the test VM's emulated CPU takes longer at 10k).
var firstSyncLimit time.Duration

// runFile measures kproxy in mode with the file source on c (which it
// changes; the caller generates a fresh one per run). times, when not
// zero, is how many of each single change to make instead of
// fileChanges' counts.
func runFile(tb *TB, bin, mode string, c *cluster.Cluster, rep, times int) FileResult {
	dir := tb.TempDir()
	snap := filepath.Join(dir, "cluster.json")
	write := func() {
		tmp := snap + ".tmp"
		f, err := os.Create(tmp)
		if err != nil {
			tb.Fatal(err)
		}
		if err := c.WriteJSON(f); err != nil {
			f.Close()
			tb.Fatal(err)
		}
		if err := f.Close(); err != nil {
			tb.Fatal(err)
		}
		if err := os.Rename(tmp, snap); err != nil {
			tb.Fatal(err)
		}
	}
	write()
	res := FileResult{Services: len(c.Services), Endpoints: c.Endpoints(), Mix: string(c.Opts.Mix), Mode: mode, Rep: rep}
	ns := framework.AddNamespace(tb, "kpe2e-bfile")
	p := Proxy{Name: "kproxy", Bin: bin}
	// No periodic full sync during the measurement (--iptables-sync-period
	// is nftables mode's too, as upstream).
	argv, err := p.argv(tb, mode, c.LocalNode().Name, 4, "--from-file", snap, "--iptables-sync-period", "1h", "--ipvs-sync-period", "1h")
	if err != nil {
		tb.Fatal(err)
	}
	started := time.Now()
	proc := framework.StartProcess(tb, ns, logDirFor(tb), "kproxy", argv...)
	families := hostFamilies()
	limit := 10 * time.Minute
	if firstSyncLimit > 0 {
		limit = firstSyncLimit
	}
	fs := waitFirstSync(tb, ns, proc, started, limit, families)
	res.TimeToFirstSync, res.CPUToFirstSync = fs.TimeTo, fs.CPU
	// The metrics can run ahead of the log's last lines: wait (a few
	// seconds at most) until the log holds every family's full sync.
	var syncs []Sync
	var off int64
	for logDeadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		syncs, off = readSyncs(proc.Log, 0)
		full := 0
		for _, s := range syncs {
			if s.Full {
				full++
			}
		}
		if full >= families || time.Now().After(logDeadline) {
			break
		}
	}
	for _, s := range syncs {
		if s.Full {
			res.FirstSync = addSync(res.FirstSync, s)
		}
	}
	time.Sleep(wait(3 * time.Second))
	res.RSSSteadyMiB = procStatusMiB(proc.Pid(), "VmRSS")
	res.RSSPeakMiB = procStatusMiB(proc.Pid(), "VmHWM")
	client := framework.HTTPClientIn(ns)
	if m, err := scrape(tb.Context(), client, metricsURL); err == nil {
		res.HeapMiB = m.Sum(mHeapInuse) / (1 << 20)
	}
	_, off = readSyncs(proc.Log, off) // the clean-up sync after the first
	tb.Logf("  kproxy %s, file source, %d services / %d endpoints: first sync %.3f s (%.2f s from start, %.2f CPU s), RSS %.0f MiB (peak %.0f)",
		mode, res.Services, res.Endpoints, res.FirstSync.Seconds, res.TimeToFirstSync, res.CPUToFirstSync, res.RSSSteadyMiB, res.RSSPeakMiB)

	// apply makes one change and measures it; false (and res.Error) when
	// no sync followed: the figures so far are kept, the changes stop.
	apply := func(kind string, ch cluster.Change) bool {
		tb.Check()
		before, err := scrape(tb.Context(), client, metricsURL)
		if err != nil {
			tb.Fatalf("metrics: %v", err)
		}
		write()
		// Wait until a sync has followed the change, then 1.5 s more for
		// the clean-up sync; at most 1 minute plus 20 ms per service
		// (reading a 10k-service file took ~50 s on a machine at load 24).
		limit := time.Minute + time.Duration(res.Services)*20*time.Millisecond
		deadline := time.Now().Add(limit)
		var syncedAt time.Time
		for time.Now().Before(deadline) && tb.Context().Err() == nil {
			time.Sleep(50 * time.Millisecond)
			ctx, cancel := context.WithTimeout(tb.Context(), 5*time.Second)
			m, err := scrape(ctx, client, metricsURL)
			cancel()
			if err != nil {
				continue
			}
			changed := m.Sum(mEPChanges)+m.Sum(mSvcChanges) > before.Sum(mEPChanges)+before.Sum(mSvcChanges)
			if syncedAt.IsZero() && changed && m.Sum(mSync+"_count") > before.Sum(mSync+"_count") {
				syncedAt = time.Now()
			}
			if !syncedAt.IsZero() && time.Since(syncedAt) > 1500*time.Millisecond {
				break
			}
		}
		if tb.Context().Err() != nil {
			// Interrupted: keep the figures so far (the run's report
			// says it was interrupted).
			res.Error = "interrupted"
			return false
		}
		if syncedAt.IsZero() {
			res.Error = fmt.Sprintf("no sync within %s of the change %q", limit, ch.Name)
			tb.Logf("  %s; last lines of kproxy's log:\n%s", res.Error, proc.Tail(20))
			return false
		}
		var syncs []Sync
		syncs, off = readSyncs(proc.Log, off)
		cr := ChangeResult{Kind: kind, Name: ch.Name, Endpoints: ch.Endpoints, Syncs: syncs}
		for i, s := range syncs {
			if i == 0 {
				cr.First = s.Seconds
			}
			cr.Total += s.Seconds
		}
		res.Changes = append(res.Changes, cr)
		return true
	}
	ok := true
	for _, fc := range fileChanges {
		n := fc.times
		if times > 0 && fc.kind != "rollout-50" && fc.kind != "burst-1000" {
			n = times
		}
		for i := 0; ok && i < n; i++ {
			switch fc.kind {
			case "endpoint-ready-flip":
				ok = apply(fc.kind, c.FlipReady())
			case "pod-rescheduled":
				ok = apply(fc.kind, c.Reschedule())
			case "service-added":
				ok = apply(fc.kind, c.AddService())
			case "service-removed":
				ok = apply(fc.kind, c.RemoveService())
			case "rollout-50":
				// The steps of a rollout come a few seconds apart in a real
				// cluster: one at a time here too.
				for ch := range c.Rollout() {
					if ok = apply(fc.kind, ch); !ok {
						break
					}
				}
			case "burst-1000":
				ok = apply(fc.kind, c.Burst(1000))
			}
		}
	}
	res.RSSEndMiB = procStatusMiB(proc.Pid(), "VmRSS")
	res.RSSPeakEnd = procStatusMiB(proc.Pid(), "VmHWM")
	if err := proc.Stop(); err != nil {
		tb.Logf("stopping kproxy: %v", err)
	}
	return res
}

// addSync adds b's figures to a's (two families of one sync).
func addSync(a, b Sync) Sync {
	a.Full = a.Full || b.Full
	a.Seconds += b.Seconds
	a.Model = max(a.Model, b.Model) // the model's work is shared by the families
	a.Render += b.Render
	a.Lower += b.Lower
	a.Kernel += b.Kernel
	a.Bytes += b.Bytes
	a.Messages += b.Messages
	return a
}
