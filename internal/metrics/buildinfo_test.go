package metrics

import (
	"runtime"
	"testing"
)

// TestBuildInfo: kubernetes_build_info carries the version given (kproxy's),
// in one series, not component-base's unset build values.
func TestBuildInfo(t *testing.T) {
	defer SetBuildInfo(BuildInfo(""))
	SetBuildInfo(BuildInfo("v1.2.3-dev"))
	SetBuildInfo(BuildInfo("v4.5.6"))
	mfs, err := Gatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kubernetes_build_info" {
			continue
		}
		if len(mf.GetMetric()) != 1 {
			t.Fatalf("%d series, want 1", len(mf.GetMetric()))
		}
		got := map[string]string{}
		for _, l := range mf.GetMetric()[0].GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		for k, want := range map[string]string{"git_version": "v4.5.6", "major": "4", "minor": "5", "go_version": runtime.Version(), "compiler": runtime.Compiler} {
			if got[k] != want {
				t.Errorf("label %s = %q, want %q (all: %v)", k, got[k], want, got)
			}
		}
		if v := mf.GetMetric()[0].GetGauge().GetValue(); v != 1 {
			t.Errorf("value %v, want 1", v)
		}
		return
	}
	t.Fatal("kubernetes_build_info is not served")
}
