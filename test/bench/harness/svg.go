package harness

import (
	"fmt"
	"html"
	"math"
	"slices"
	"strings"
)

// plot is a line chart of a figure against the service count, one line
// per proxy and mode, written as SVG by hand (no plotting dependency).
type plot struct {
	title, ylabel string
	xs            []int
	series        []series
}

type series struct {
	name string
	y    map[int]Stat // by service count
}

func plots(r *Report) map[string]plot {
	xs := ns(r)
	out := map[string]plot{}
	api := func(name, title, ylabel string, scale float64, get func(APIResult) []float64) {
		p := plot{title: title, ylabel: ylabel, xs: xs}
		for _, mode := range r.Config.Modes {
			for _, pr := range r.Config.Proxies {
				s := series{name: pr.Name + " " + mode, y: map[int]Stat{}}
				for _, n := range xs {
					st := r.apiStat(n, pr.Name, mode, get)
					if st.N > 0 {
						st.Median, st.Min, st.Max = st.Median*scale, st.Min*scale, st.Max*scale
						s.y[n] = st
					}
				}
				if len(s.y) > 0 {
					p.series = append(p.series, s)
				}
			}
		}
		out[name] = p
	}
	api("sync", "Time to the first full sync, against kube-apiserver", "seconds", 1, one(func(a APIResult) float64 { return a.TimeToFirstSync }))
	api("cpu", "CPU seconds to the first full sync", "CPU seconds", 1, one(func(a APIResult) float64 { return a.CPUToFirstSync }))
	api("npl", "Network programming latency per endpoint change", "milliseconds", 1000, func(a APIResult) []float64 { return a.NPL })
	api("memory", "RSS 5 s after the first sync", "MiB", 1, one(func(a APIResult) float64 { return a.RSSSteadyMiB }))
	api("connect", "New-connection latency (p50) to the last service", "microseconds", 1, probe("last", func(p Probe) float64 { return p.P50us }))
	fp := plot{title: "kproxy, file source: first full sync", ylabel: "seconds", xs: xs}
	for _, mode := range r.Config.Modes {
		s := series{name: "kproxy " + mode, y: map[int]Stat{}}
		for _, n := range xs {
			if st := r.fileStat(n, mode, func(f FileResult) []float64 { return []float64{f.FirstSync.Seconds} }); st.N > 0 {
				s.y[n] = st
			}
		}
		if len(s.y) > 0 {
			fp.series = append(fp.series, s)
		}
	}
	out["file-sync"] = fp
	return out
}

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"}

// svg draws the chart: x evenly spaced by service count (1k, 10k, 50k
// are not meant to be read off a linear axis), y linear from 0; a dot at
// each median with a bar from min to max.
func (p plot) svg() string {
	const w, h, left, right, top, bottom = 720, 420, 70, 230, 40, 50
	pw, ph := float64(w-left-right), float64(h-top-bottom)
	ymax := 0.0
	for _, s := range p.series {
		for _, st := range s.y {
			ymax = math.Max(ymax, st.Max)
		}
	}
	if ymax == 0 {
		ymax = 1
	}
	ymax = niceCeil(ymax * 1.05)
	xpos := func(n int) float64 {
		i := slices.Index(p.xs, n)
		if len(p.xs) == 1 {
			return float64(left) + pw/2
		}
		return float64(left) + pw*float64(i)/float64(len(p.xs)-1)
	}
	ypos := func(v float64) float64 { return float64(top) + ph*(1-v/ymax) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15">%s</text>`+"\n", left, html.EscapeString(p.title))
	for i := 0; i <= 5; i++ {
		v := ymax * float64(i) / 5
		y := ypos(v)
		fmt.Fprintf(&b, `<line x1="%d" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, float64(left)+pw, y, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y+4, trimFloat(v))
	}
	for _, n := range p.xs {
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", xpos(n), h-bottom+18, countLabel(n))
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">services</text>`+"\n", float64(left)+pw/2, h-12)
	fmt.Fprintf(&b, `<text transform="translate(16,%.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", float64(top)+ph/2, html.EscapeString(p.ylabel))
	for i, s := range p.series {
		color := palette[i%len(palette)]
		dash := "" // kproxy solid, the others dashed
		if !strings.HasPrefix(s.name, "kproxy") {
			dash = ` stroke-dasharray="6,4"`
		}
		var pts []string
		for _, n := range p.xs {
			if st, ok := s.y[n]; ok {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", xpos(n), ypos(st.Median)))
				fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s"/>`+"\n", xpos(n), xpos(n), ypos(st.Min), ypos(st.Max), color)
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="4" fill="%s"><title>%s at %d: %s</title></circle>`+"\n", xpos(n), ypos(st.Median), color, html.EscapeString(s.name), n, trimFloat(st.Median))
			}
		}
		if len(pts) > 1 {
			fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", strings.Join(pts, " "), color, dash)
		}
		ly := top + 10 + 20*i
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n", w-right+15, w-right+40, ly, ly, color, dash)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", w-right+46, ly+4, html.EscapeString(s.name))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// soakSVG draws each soak's RSS against the seconds since its first
// change: one line per proxy and mode, x and y linear from 0.
func soakSVG(soaks []SoakResult) string {
	const w, h, left, right, top, bottom = 720, 420, 70, 230, 40, 50
	pw, ph := float64(w-left-right), float64(h-top-bottom)
	xmax, ymax := 1.0, 1.0
	for _, s := range soaks {
		ymax = math.Max(ymax, s.RSSSettledMiB)
		for _, x := range s.Samples {
			xmax, ymax = math.Max(xmax, x.Seconds), math.Max(ymax, x.RSSMiB)
		}
	}
	xmax, ymax = niceCeil(xmax), niceCeil(ymax*1.05)
	xpos := func(v float64) float64 { return float64(left) + pw*v/xmax }
	ypos := func(v float64) float64 { return float64(top) + ph*(1-v/ymax) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15">RSS during the soak (dotted: settled after the first sync)</text>`+"\n", left)
	for i := 0; i <= 5; i++ {
		y, x := ypos(ymax*float64(i)/5), xpos(xmax*float64(i)/5)
		fmt.Fprintf(&b, `<line x1="%d" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, float64(left)+pw, y, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y+4, trimFloat(ymax*float64(i)/5))
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, h-bottom+18, trimFloat(xmax*float64(i)/5))
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">seconds since the first change</text>`+"\n", float64(left)+pw/2, h-12)
	fmt.Fprintf(&b, `<text transform="translate(16,%.1f) rotate(-90)" text-anchor="middle">RSS (MiB)</text>`+"\n", float64(top)+ph/2)
	for i, s := range soaks {
		color := palette[i%len(palette)]
		var pts []string
		for _, x := range s.Samples {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", xpos(x.Seconds), ypos(x.RSSMiB)))
		}
		fmt.Fprintf(&b, `<line x1="%d" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s" stroke-dasharray="2,3"/>`+"\n", left, float64(left)+pw, ypos(s.RSSSettledMiB), ypos(s.RSSSettledMiB), color)
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(pts, " "), color)
		ly := top + 10 + 20*i
		name := s.Proxy + " " + s.Mode
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2"/>`+"\n", w-right+15, w-right+40, ly, ly, color)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", w-right+46, ly+4, html.EscapeString(name))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func niceCeil(v float64) float64 {
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*e >= v {
			return m * e
		}
	}
	return 10 * e
}

func trimFloat(v float64) string { return fmt.Sprintf("%.3g", v) }

func countLabel(n int) string {
	if n >= 1000 && n%1000 == 0 {
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}
