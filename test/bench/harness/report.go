package harness

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Stat is a figure over repetitions.
type Stat struct {
	Median, Min, Max float64
	N                int
}

func stat(xs []float64) Stat {
	var v []float64
	for _, x := range xs {
		if x >= 0 && !math.IsNaN(x) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return Stat{}
	}
	slices.Sort(v)
	m := v[len(v)/2]
	if len(v)%2 == 0 {
		m = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return Stat{Median: m, Min: v[0], Max: v[len(v)-1], N: len(v)}
}

// cell is "median (min–max)" scaled, or "—".
func (s Stat) cell(scale float64, prec int) string {
	if s.N == 0 {
		return "—"
	}
	f := func(x float64) string { return fmt.Sprintf("%.*f", prec, x*scale) }
	if s.N == 1 || s.Min == s.Max {
		return f(s.Median)
	}
	return fmt.Sprintf("%s (%s–%s)", f(s.Median), f(s.Min), f(s.Max))
}

// WriteReport writes report.json, report.md and the SVG plots into dir.
func WriteReport(dir string, r *Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), data, 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "report.md"))
	if err != nil {
		return err
	}
	Markdown(f, r)
	if err := f.Close(); err != nil {
		return err
	}
	if len(r.Soak) > 0 {
		if err := os.WriteFile(filepath.Join(dir, "soak.svg"), []byte(soakSVG(r.Soak)), 0o644); err != nil {
			return err
		}
	}
	for name, p := range plots(r) {
		if len(p.series) == 0 {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, name+".svg"), []byte(p.svg()), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func ns(r *Report) []int {
	var out []int
	for _, x := range r.API {
		out = append(out, x.Services)
	}
	for _, x := range r.File {
		out = append(out, x.Services)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// apiFigure is one row of the side-by-side table.
type apiFigure struct {
	name  string
	scale float64
	prec  int
	get   func(APIResult) []float64
}

func one(f func(APIResult) float64) func(APIResult) []float64 {
	return func(a APIResult) []float64 { return []float64{f(a)} }
}

func probe(which string, f func(Probe) float64) func(APIResult) []float64 {
	return func(a APIResult) []float64 {
		for _, p := range a.DataPlane {
			if p.Which == which {
				return []float64{f(p)}
			}
		}
		return nil
	}
}

var apiFigures = []apiFigure{
	{"time to first sync (s)", 1, 2, one(func(a APIResult) float64 { return a.TimeToFirstSync })},
	{"first sync itself (s)", 1, 2, one(func(a APIResult) float64 { return a.FirstSyncSeconds })},
	{"CPU to first sync (s)", 1, 1, one(func(a APIResult) float64 { return a.CPUToFirstSync })},
	{"RSS 5 s after first sync (MiB)", 1, 0, one(func(a APIResult) float64 { return a.RSSSteadyMiB })},
	{"RSS peak by then (MiB)", 1, 0, one(func(a APIResult) float64 { return a.RSSPeakMiB })},
	{"RSS at the end (MiB)", 1, 0, one(func(a APIResult) float64 { return a.RSSEndMiB })},
	{"sync time per endpoint change (ms)", 1000, 1, func(a APIResult) []float64 { return a.ChangeSync }},
	{"network programming latency (ms)", 1000, 0, func(a APIResult) []float64 { return a.NPL }},
	{"connect p50, first service (µs)", 1, 0, probe("first", func(p Probe) float64 { return p.P50us })},
	{"connect p50, middle service (µs)", 1, 0, probe("middle", func(p Probe) float64 { return p.P50us })},
	{"connect p50, last service (µs)", 1, 0, probe("last", func(p Probe) float64 { return p.P50us })},
	{"connect p99, last service (µs)", 1, 0, probe("last", func(p Probe) float64 { return p.P99us })},
	{"connections/s, last service", 1, 0, probe("last", func(p Probe) float64 { return p.PerSec })},
}

func (r *Report) apiStat(n int, proxy, mode string, get func(APIResult) []float64) Stat {
	var xs []float64
	for _, a := range r.API {
		if a.Services == n && a.Proxy == proxy && a.Mode == mode {
			xs = append(xs, get(a)...)
		}
	}
	return stat(xs)
}

// fileFigure is one column group of the file-source table.
func (r *Report) fileStat(n int, mode string, get func(FileResult) []float64) Stat {
	var xs []float64
	for _, f := range r.File {
		if f.Services == n && f.Mode == mode {
			xs = append(xs, get(f)...)
		}
	}
	return stat(xs)
}

func changeSyncs(kind string, total bool) func(FileResult) []float64 {
	return func(f FileResult) []float64 {
		var out []float64
		for _, c := range f.Changes {
			if c.Kind == kind {
				if total {
					out = append(out, c.Total)
				} else {
					out = append(out, c.First)
				}
			}
		}
		return out
	}
}

// msBound is a histogram bound in ms ("> last bucket" for +Inf).
func msBound(s float64) string {
	if math.IsInf(s, 1) {
		return "beyond the last bucket"
	}
	return fmt.Sprintf("≤ %.0f", s*1000)
}

// Markdown writes the tables.
func Markdown(w io.Writer, r *Report) {
	fmt.Fprintf(w, "Run %s – %s on %s; mix %s, seed %d, %d repetition(s).\n\n", r.Started.Format("2006-01-02 15:04"), r.Ended.Format("15:04 UTC"), r.Machine, r.Config.Mix, r.Config.Seed, r.Config.Reps)
	if len(r.API) > 0 {
		var proxies []string
		for _, p := range r.Config.Proxies {
			proxies = append(proxies, p.Name)
		}
		for _, n := range ns(r) {
			for _, mode := range r.Config.Modes {
				if r.apiStat(n, proxies[0], mode, one(func(a APIResult) float64 { return a.TimeToFirstSync })).N == 0 {
					continue
				}
				endpoints := 0
				for _, a := range r.API {
					if a.Services == n {
						endpoints = a.Endpoints
					}
				}
				fmt.Fprintf(w, "#### Against kube-apiserver: %d services (%d endpoints), %s\n\n", n, endpoints, mode)
				fmt.Fprintf(w, "| figure | %s |", strings.Join(proxies, " | "))
				if len(proxies) == 2 {
					fmt.Fprintf(w, " %s / %s |", proxies[0], proxies[1])
				}
				ratio := 0
				if len(proxies) == 2 {
					ratio = 1 // the ratio column
				}
				fmt.Fprintf(w, "\n|---|%s\n", strings.Repeat("---|", len(proxies)+ratio))
				for _, fig := range apiFigures {
					var cells []string
					var meds []float64
					for _, p := range proxies {
						s := r.apiStat(n, p, mode, fig.get)
						cells = append(cells, s.cell(fig.scale, fig.prec))
						meds = append(meds, s.Median)
					}
					if len(proxies) == 2 {
						ratio := "—"
						if meds[1] > 0 && meds[0] > 0 {
							ratio = fmt.Sprintf("%.2f", meds[0]/meds[1])
						}
						cells = append(cells, ratio)
					}
					fmt.Fprintf(w, "| %s | %s |\n", fig.name, strings.Join(cells, " | "))
				}
				fmt.Fprintln(w)
			}
		}
	}
	if len(r.Soak) > 0 {
		fmt.Fprintf(w, "#### Soak against kube-apiserver\n\n")
		fmt.Fprintf(w, "Settled: 30 s after the first sync; end: 30 s after the last change.\n\n")
		fmt.Fprintf(w, "| proxy | mode | services (endpoints) | changes over s | RSS settled (MiB) | RSS max (MiB) | RSS end (MiB) | end / settled | heap settled → end (MiB) | peak RSS at the end (MiB) | syncs | CPU s | latency mean / p99 (ms) |\n")
		fmt.Fprintf(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, s := range r.Soak {
			ratio := "—"
			if s.RSSSettledMiB > 0 {
				ratio = fmt.Sprintf("%.2f", s.RSSEndMiB/s.RSSSettledMiB)
			}
			fmt.Fprintf(w, "| %s | %s | %d (%d) | %d over %.0f | %.0f | %.0f | %.0f | %s | %.0f → %.0f | %.0f | %.0f | %.1f | %.0f / %s |\n",
				s.Proxy, s.Mode, s.Services, s.Endpoints, s.Changes, s.Seconds, s.RSSSettledMiB, s.RSSMaxMiB, s.RSSEndMiB, ratio,
				s.HeapSettledMiB, s.HeapEndMiB, s.RSSPeakEndMiB, s.Syncs, s.CPUSeconds, s.NPLMean*1000, msBound(s.NPLP99))
		}
		fmt.Fprintln(w)
	}
	if len(r.File) > 0 {
		fmt.Fprintf(w, "#### kproxy with the file source, in a fresh network namespace\n\n")
		fmt.Fprintf(w, "Sync times in ms: the first sync after the change (all of it: phases in report.json), then with kproxy's clean-up sync a second later.\n\n")
		fmt.Fprintf(w, "| services (endpoints) | mode | first sync (s): total / model / render / lowering / kernel | MiB to the kernel | RSS steady (peak), heap MiB | endpoint ready flip | pod rescheduled | service added | service removed | rollout step (50 pods) | burst of 1000 | RSS at the end (peak) |\n")
		fmt.Fprintf(w, "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, n := range ns(r) {
			for _, mode := range r.Config.Modes {
				get := func(f func(FileResult) float64) Stat {
					return r.fileStat(n, mode, func(x FileResult) []float64 { return []float64{f(x)} })
				}
				first := get(func(f FileResult) float64 { return f.FirstSync.Seconds })
				if first.N == 0 {
					continue
				}
				endpoints := 0
				for _, f := range r.File {
					if f.Services == n {
						endpoints = f.Endpoints
					}
				}
				phases := fmt.Sprintf("%s / %s / %s / %s / %s", first.cell(1, 2),
					get(func(f FileResult) float64 { return f.FirstSync.Model }).cell(1, 3),
					get(func(f FileResult) float64 { return f.FirstSync.Render }).cell(1, 2),
					get(func(f FileResult) float64 { return f.FirstSync.Lower }).cell(1, 2),
					get(func(f FileResult) float64 { return f.FirstSync.Kernel }).cell(1, 2))
				row := []string{fmt.Sprintf("%d (%d)", n, endpoints), mode, phases,
					get(func(f FileResult) float64 { return float64(f.FirstSync.Bytes) / (1 << 20) }).cell(1, 1),
					fmt.Sprintf("%s (%s), %s", get(func(f FileResult) float64 { return f.RSSSteadyMiB }).cell(1, 0),
						get(func(f FileResult) float64 { return f.RSSPeakMiB }).cell(1, 0),
						get(func(f FileResult) float64 { return f.HeapMiB }).cell(1, 0))}
				for _, kind := range []string{"endpoint-ready-flip", "pod-rescheduled", "service-added", "service-removed", "rollout-50", "burst-1000"} {
					row = append(row, r.fileStat(n, mode, changeSyncs(kind, false)).cell(1000, 1)+" / "+r.fileStat(n, mode, changeSyncs(kind, true)).cell(1000, 1))
				}
				row = append(row, fmt.Sprintf("%s (%s)", get(func(f FileResult) float64 { return f.RSSEndMiB }).cell(1, 0), get(func(f FileResult) float64 { return f.RSSPeakEnd }).cell(1, 0)))
				fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
			}
		}
		fmt.Fprintln(w)
	}
	if len(r.Errors) > 0 {
		fmt.Fprintf(w, "Failed runs:\n\n")
		for _, e := range r.Errors {
			fmt.Fprintf(w, "- %s\n", strings.SplitN(e, "\n", 2)[0])
		}
	}
}

// Merge joins reports of separate runs (say 1k and 10k side by side, a
// soak, the file source at 50k) into one, for one set of tables and
// plots: their results in order, the union of their service counts,
// modes and proxies (by name, the first one's binary), the earliest start
// and the latest end. Config's other fields are the first report's.
func Merge(reports ...*Report) *Report {
	if len(reports) == 0 {
		return &Report{}
	}
	out := &Report{Config: reports[0].Config, Started: reports[0].Started, Ended: reports[0].Ended, Machine: reports[0].Machine}
	out.Config.Services, out.Config.Modes, out.Config.Proxies = nil, nil, nil
	for _, r := range reports {
		for _, n := range r.Config.Services {
			if !slices.Contains(out.Config.Services, n) {
				out.Config.Services = append(out.Config.Services, n)
			}
		}
		for _, m := range r.Config.Modes {
			if !slices.Contains(out.Config.Modes, m) {
				out.Config.Modes = append(out.Config.Modes, m)
			}
		}
		for _, p := range r.Config.Proxies {
			if !slices.ContainsFunc(out.Config.Proxies, func(q Proxy) bool { return q.Name == p.Name }) {
				out.Config.Proxies = append(out.Config.Proxies, p)
			}
		}
		if r.Started.Before(out.Started) {
			out.Started = r.Started
		}
		if r.Ended.After(out.Ended) {
			out.Ended = r.Ended
		}
		out.File = append(out.File, r.File...)
		out.API = append(out.API, r.API...)
		out.Soak = append(out.Soak, r.Soak...)
		out.Errors = append(out.Errors, r.Errors...)
	}
	slices.Sort(out.Config.Services)
	return out
}

// ReadReport reads a report.json.
func ReadReport(path string) (*Report, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r := &Report{}
	if err := json.Unmarshal(data, r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}
