package e2erun

import (
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestReadJUnit reads a report in the form e2e.test writes (ginkgo's JUnit
// with the framework's settings): only the "[It]" specs the run selected
// (not the DNS test its focus left out), their results mapped to passed,
// failed and skipped, the first line of each message.
func TestReadJUnit(t *testing.T) {
	cases, err := ReadJUnit(filepath.Join("testdata", "junit_sample.xml"))
	if err != nil {
		t.Fatal(err)
	}
	want := []Case{
		{Name: "[sig-network] Services should be able to create a functioning NodePort service [Conformance]", Result: Failed, Seconds: 124.8,
			Message: "[FAILED] service is not reachable within 2m0s timeout on endpoint 198.18.2.2:31234 over TCP protocol"},
		{Name: "[sig-network] Services should serve a basic endpoint from pods [Conformance]", Result: Passed, Seconds: 22.31},
		{Name: "[sig-network] Services should have session affinity timeout work for NodePort service [LinuxOnly] [Conformance]", Result: Skipped, Seconds: 0.02,
			Message: "skipped - Only supported for node OS distro [gci ubuntu] (not debian)"},
		{Name: "[sig-network] Services should serve multiport endpoints from pods [Conformance]", Result: Failed, Seconds: 35.1,
			Message: "timedout"},
	}
	if d := cmp.Diff(want, cases); d != "" {
		t.Errorf("cases (-want +got):\n%s", d)
	}
}

func TestParseJUnitRejectsGarbage(t *testing.T) {
	if _, err := ParseJUnit([]byte("<testsuites><testsuite>")); err == nil {
		t.Error("a truncated report parsed")
	}
}
