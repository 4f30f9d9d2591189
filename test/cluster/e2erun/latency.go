package e2erun

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// LatencyMetric is the histogram of network programming latency kube-proxy
// exports and kproxy exports under the same name: the time from a change
// of a Service's endpoints (the EndpointSlice's last-change-trigger-time
// annotation) to the sync that programmed it.
const LatencyMetric = "kubeproxy_network_programming_duration_seconds"

// Histogram is a cumulative Prometheus histogram: Counts[i] observations
// at most Bounds[i] seconds, the last bound +Inf; Sum of all observations.
type Histogram struct {
	Bounds []float64
	Counts []float64
	Sum    float64
}

// ReadHistogram reads the named histogram from scraped /metrics text (one
// scrape or several concatenated, lines of other metrics and anything
// else ignored) and adds up the buckets of every series: all the nodes'
// proxies, all the IP families.
func ReadHistogram(r io.Reader, name string) (Histogram, error) {
	counts := map[float64]float64{}
	var sum float64
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 2 && (f[0] == name+"_sum" || strings.HasPrefix(f[0], name+"_sum{")) {
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				return Histogram{}, fmt.Errorf("%s: sum in %q: %w", name, sc.Text(), err)
			}
			sum += v
			continue
		}
		line, ok := strings.CutPrefix(sc.Text(), name+"_bucket{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(line, "} ")
		if !ok {
			return Histogram{}, fmt.Errorf("%s: malformed bucket line %q", name, sc.Text())
		}
		var le string
		for _, l := range strings.Split(labels, ",") {
			if v, ok := strings.CutPrefix(l, `le="`); ok {
				le = strings.TrimSuffix(v, `"`)
			}
		}
		bound, err := strconv.ParseFloat(le, 64)
		if err != nil {
			return Histogram{}, fmt.Errorf("%s: bucket bound in %q: %w", name, sc.Text(), err)
		}
		n, err := strconv.ParseFloat(strings.Fields(value)[0], 64)
		if err != nil {
			return Histogram{}, fmt.Errorf("%s: count in %q: %w", name, sc.Text(), err)
		}
		counts[bound] += n
	}
	if err := sc.Err(); err != nil {
		return Histogram{}, err
	}
	if len(counts) == 0 {
		return Histogram{}, fmt.Errorf("no %s_bucket lines", name)
	}
	h := Histogram{Sum: sum}
	for _, b := range slices.Sorted(func(yield func(float64) bool) {
		for b := range counts {
			if !yield(b) {
				return
			}
		}
	}) {
		h.Bounds = append(h.Bounds, b)
		h.Counts = append(h.Counts, counts[b])
	}
	if !math.IsInf(h.Bounds[len(h.Bounds)-1], 1) {
		return Histogram{}, fmt.Errorf("%s: no +Inf bucket", name)
	}
	return h, nil
}

// Total is the number of observations.
func (h Histogram) Total() float64 { return h.Counts[len(h.Counts)-1] }

// Mean is the mean observation; NaN without any.
func (h Histogram) Mean() float64 {
	if h.Total() == 0 {
		return math.NaN()
	}
	return h.Sum / h.Total()
}

// Quantile estimates the q-quantile as Prometheus's histogram_quantile
// does: linear interpolation inside the bucket that holds it (the first
// bucket from 0), and the highest finite bound when it lies in the +Inf
// bucket. NaN without observations.
func (h Histogram) Quantile(q float64) float64 {
	total := h.Total()
	if total == 0 || len(h.Bounds) < 2 {
		return math.NaN()
	}
	rank := q * total
	i := 0
	for i < len(h.Counts)-1 && h.Counts[i] < rank {
		i++
	}
	if i == len(h.Bounds)-1 {
		return h.Bounds[len(h.Bounds)-2]
	}
	lower, below := 0.0, 0.0
	if i > 0 {
		lower, below = h.Bounds[i-1], h.Counts[i-1]
	}
	inBucket := h.Counts[i] - below
	if inBucket == 0 {
		return h.Bounds[i]
	}
	return lower + (h.Bounds[i]-lower)*(rank-below)/inBucket
}
