package harness

import (
	"context"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kproxy/kproxy/test/e2e/framework"
)

// SoakResult is one proxy's soak against the API server: many endpoint
// changes at a steady rate, with the process's memory sampled along the
// way, to show whether memory returns to where it settled after the
// first sync.
type SoakResult struct {
	Services  int    `json:"services"`
	Endpoints int    `json:"endpoints"`
	Proxy     string `json:"proxy"`
	Mode      string `json:"mode"`
	// Changes is how many endpoint flips were written, over Seconds.
	Changes int     `json:"changes"`
	Seconds float64 `json:"seconds"`
	// Settled: RSS, the Go heap in use and CPU seconds 30 s after the
	// first sync. End: the same 30 s after the last change. Max: the
	// largest RSS sampled in between; PeakEnd: VmHWM at the end.
	RSSSettledMiB  float64 `json:"rssSettledMiB"`
	HeapSettledMiB float64 `json:"heapSettledMiB"`
	RSSEndMiB      float64 `json:"rssEndMiB"`
	HeapEndMiB     float64 `json:"heapEndMiB"`
	RSSMaxMiB      float64 `json:"rssMaxMiB"`
	RSSPeakEndMiB  float64 `json:"rssPeakEndMiB"`
	CPUSeconds     float64 `json:"cpuSeconds"`
	// Syncs the proxy made during the soak, the network programming
	// latency observations and their mean and p99 (from the histogram's
	// buckets: the upper bound of the bucket holding the 99th percentile).
	Syncs   float64 `json:"syncs"`
	NPLs    float64 `json:"networkProgrammingObservations"`
	NPLMean float64 `json:"networkProgrammingMeanSeconds"`
	NPLP99  float64 `json:"networkProgrammingP99Seconds"`
	// Samples every 10 s from the first change.
	Samples []SoakSample `json:"samples"`
}

// SoakSample is the process's memory at one moment of the soak.
type SoakSample struct {
	Seconds float64 `json:"seconds"`
	Changes int     `json:"changes"`
	RSSMiB  float64 `json:"rssMiB"`
	HeapMiB float64 `json:"heapMiB"`
}

// runSoak starts proxy p in mode, waits for its first sync to settle,
// then writes changes endpoint flips evenly over d (they do not wait for
// each other to be programmed), sampling memory every 10 s, and reads
// memory again 30 s after the last one.
//
// With profileDir set, the proxy runs with --profiling (both proxies
// serve /debug/pprof on the metrics address then) and a CPU profile of
// up to 30 s (half the soak when shorter) taken from its middle is
// written there as soak-PROXY-MODE.pprof, with heap profiles of the
// settled and the end moments (soak-PROXY-MODE-heap-settled.pprof, -heap-end.pprof; `go tool
// pprof -base` on the two shows what the soak left live) and their text
// forms (.txt: the runtime's memory statistics are at their end).
func (a *apiCluster) runSoak(tb *TB, p Proxy, mode string, changes int, d time.Duration, profileDir string) SoakResult {
	c := a.c
	res := SoakResult{Services: len(c.Services), Endpoints: c.Endpoints(), Proxy: p.Name, Mode: mode}
	var extra []string
	if profileDir != "" {
		extra = append(extra, "--profiling")
	}
	ns, proc, _ := a.startProxy(tb, p, mode, "kpe2e-bsoak", extra...)
	client := framework.HTTPClientIn(ns)
	heap := func() float64 {
		m, err := scrape(tb.Context(), client, metricsURL)
		if err != nil {
			return -1
		}
		return m.Sum(mHeapInuse) / (1 << 20)
	}
	time.Sleep(wait(30 * time.Second))
	res.RSSSettledMiB, res.HeapSettledMiB = procStatusMiB(proc.Pid(), "VmRSS"), heap()
	heapProfile := func(moment string) {
		if profileDir == "" {
			return
		}
		base := filepath.Join(profileDir, "soak-"+p.Name+"-"+mode+"-heap-"+moment)
		for _, f := range []struct{ query, ext string }{{"", ".pprof"}, {"?debug=1", ".txt"}} {
			if err := fetchTo(tb.Context(), client, "http://"+metricsListen+"/debug/pprof/heap"+f.query, base+f.ext); err != nil {
				tb.Logf("  %s %s soak: no heap profile (%s): %v", p.Name, mode, moment, err)
				return
			}
		}
	}
	heapProfile("settled")
	cpu0 := cpuSeconds(proc.Pid())
	before, err := scrape(tb.Context(), client, metricsURL)
	if err != nil {
		tb.Fatalf("metrics: %v", err)
	}
	tb.Logf("  %s %s soak: settled at RSS %.0f MiB, heap %.0f MiB; %d endpoint changes over %s",
		p.Name, mode, res.RSSSettledMiB, res.HeapSettledMiB, changes, d)

	interval := d / time.Duration(max(changes, 1))
	start := time.Now()
	profiled := make(chan struct{})
	if profileDir != "" {
		go func() {
			defer close(profiled)
			// Up to 30 s, centred on the soak's middle; a short soak's
			// profile is half of it.
			secs := max(int(min(30*time.Second, d/2)/time.Second), 1)
			select {
			case <-time.After(d/2 - time.Duration(secs)*time.Second/2):
			case <-tb.Context().Done():
				return // interrupted: no profile, no wait
			}
			path := filepath.Join(profileDir, "soak-"+p.Name+"-"+mode+".pprof")
			// The metrics client gives up after seconds; the profile
			// takes up to 30.
			slow := *client
			slow.Timeout = 2 * time.Minute
			if err := fetchTo(tb.Context(), &slow, "http://"+metricsListen+"/debug/pprof/profile?seconds="+strconv.Itoa(secs), path); err != nil {
				tb.Logf("  %s %s soak: no CPU profile: %v", p.Name, mode, err)
			} else {
				tb.Logf("  %s %s soak: CPU profile of %d s in %s", p.Name, mode, secs, path)
			}
		}()
	} else {
		close(profiled)
	}
	nextSample := start
	sample := func(made int) {
		s := SoakSample{Seconds: time.Since(start).Seconds(), Changes: made, RSSMiB: procStatusMiB(proc.Pid(), "VmRSS"), HeapMiB: heap()}
		res.Samples = append(res.Samples, s)
		res.RSSMaxMiB = math.Max(res.RSSMaxMiB, s.RSSMiB)
		nextSample = nextSample.Add(10 * time.Second)
	}
	// Bounded in count (changes) and in time (twice d, then it stops
	// and reports what it made).
	deadline := start.Add(2*d + time.Minute)
	for k := 0; k < changes; k++ {
		tb.Check()
		if time.Now().After(deadline) {
			tb.Logf("  %s %s soak: stopped after %d of %d changes (the API server could not keep up)", p.Name, mode, k, changes)
			break
		}
		if !time.Now().Before(nextSample) {
			sample(k)
		}
		ctx, cancel := context.WithTimeout(tb.Context(), 30*time.Second)
		err := a.update(ctx, c.FlipReady().Update[0])
		cancel()
		if err != nil {
			tb.Fatalf("soak change %d: %v", k, err)
		}
		res.Changes = k + 1
		if k%1000 == 999 {
			tb.Logf("  %s %s soak: %d of %d changes, %s, RSS %.0f MiB", p.Name, mode, k+1, changes, time.Since(start).Round(time.Second), procStatusMiB(proc.Pid(), "VmRSS"))
		}
		if sleep := time.Until(start.Add(time.Duration(k+1) * interval)); sleep > 0 {
			time.Sleep(sleep)
		}
	}
	res.Seconds = time.Since(start).Seconds()
	<-profiled
	sample(res.Changes)
	time.Sleep(wait(30 * time.Second))
	sample(res.Changes)
	res.RSSEndMiB, res.HeapEndMiB = procStatusMiB(proc.Pid(), "VmRSS"), heap()
	res.RSSPeakEndMiB = procStatusMiB(proc.Pid(), "VmHWM")
	// The end's heap profile is taken after the CPU is read: serving it
	// is not the soak's cost.
	res.CPUSeconds = cpuSeconds(proc.Pid()) - cpu0
	heapProfile("end")
	if after, err := scrape(tb.Context(), client, metricsURL); err == nil {
		res.Syncs = after.Sum(mSync+"_count") - before.Sum(mSync+"_count")
		res.NPLs = after.Sum(mNPL+"_count") - before.Sum(mNPL+"_count")
		if res.NPLs > 0 {
			res.NPLMean = (after.Sum(mNPL+"_sum") - before.Sum(mNPL+"_sum")) / res.NPLs
		}
		res.NPLP99 = histQuantile(before, after, mNPL, 0.99)
	}
	tb.Logf("  %s %s soak: %d changes in %.0f s; RSS %.0f → %.0f MiB (max %.0f), heap %.0f → %.0f MiB; %.0f syncs, %.1f CPU s; latency mean %.0f ms, p99 ≤ %.0f ms",
		p.Name, mode, res.Changes, res.Seconds, res.RSSSettledMiB, res.RSSEndMiB, res.RSSMaxMiB, res.HeapSettledMiB, res.HeapEndMiB,
		res.Syncs, res.CPUSeconds, res.NPLMean*1000, res.NPLP99*1000)
	stopProxy(tb, p, proc, "the soak")
	return res
}

// fetchTo writes what url answers to path.
func fetchTo(ctx context.Context, client *http.Client, url, path string) error {
	body, err := get(ctx, client, url)
	if err != nil {
		return err
	}
	defer body.Close()
	data, err := io.ReadAll(body)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// histQuantile is the upper bound of the bucket of histogram name holding
// quantile q of the observations made between two scrapes (all label
// sets but le added together); +Inf when it is beyond the last finite
// bucket, 0 when nothing was observed.
func histQuantile(before, after Metrics, name string, q float64) float64 {
	byLE := func(m Metrics) map[float64]float64 {
		out := map[float64]float64{}
		for labels, v := range m.Series(name + "_bucket") {
			for _, l := range strings.Split(strings.TrimSuffix(labels, "}"), ",") {
				if s, ok := strings.CutPrefix(l, `le="`); ok {
					if le, err := strconv.ParseFloat(strings.TrimSuffix(s, `"`), 64); err == nil {
						out[le] += v
					}
				}
			}
		}
		return out
	}
	b, a := byLE(before), byLE(after)
	var les []float64
	for le := range a {
		les = append(les, le)
	}
	slices.Sort(les)
	if len(les) == 0 {
		return 0
	}
	total := a[les[len(les)-1]] - b[les[len(les)-1]]
	if total <= 0 {
		return 0
	}
	for _, le := range les {
		if a[le]-b[le] >= q*total {
			return le
		}
	}
	return math.Inf(1)
}
