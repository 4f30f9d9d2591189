// Package tracetest holds what the tracers' tests share: the one-line
// shape of an outcome that their tables compare, and the check of a
// result against it.
package tracetest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kproxy/kproxy/internal/trace"
)

// Out is the expected shape of one outcome: "accept dnat=10.180.1.1:8080
// masq p=0.3333".
func Out(verdict, dnat string, masq bool, p float64) string {
	s := verdict
	if dnat != "" {
		s += " dnat=" + dnat
	}
	if masq {
		s += " masq"
	}
	return s + fmt.Sprintf(" p=%.4f", p)
}

// Summarize is every outcome of a result in Out's shape.
func Summarize(res *trace.Result) []string {
	var s []string
	for _, o := range res.Outcomes {
		d := ""
		if o.DNAT != nil {
			d = o.DNAT.String()
		}
		s = append(s, Out(o.Verdict, d, o.Masquerade, o.Probability))
	}
	return s
}

// Check compares a result's outcomes with want (in Out's shape), checks
// that their probabilities add up to 1 and that the first outcome's path
// has every one of pathHas.
func Check(t testing.TB, res *trace.Result, want, pathHas []string) {
	t.Helper()
	if diff := cmp.Diff(want, Summarize(res)); diff != "" {
		t.Errorf("outcomes (-want +got):\n%s\n%s", diff, res)
	}
	if len(res.Outcomes) == 0 {
		return
	}
	sum := 0.0
	for _, o := range res.Outcomes {
		sum += o.Probability
	}
	if sum < 0.999999 || sum > 1.000001 {
		t.Errorf("probabilities add up to %v", sum)
	}
	path := strings.Join(res.Outcomes[0].Path, "\n")
	for _, w := range pathHas {
		if !strings.Contains(path, w) {
			t.Errorf("path lacks %q:\n%s", w, path)
		}
	}
}
