package e2erun

import (
	"encoding/xml"
	"fmt"
	"os"
	"strings"
)

// Result is one test's outcome in one run, as the JUnit report of e2e.test
// (ginkgo's status attribute) says it.
type Result string

// The outcomes the tables tell apart. Ginkgo's "panicked", "interrupted",
// "aborted" and "timedout" count as failed; "pending" as skipped.
const (
	Passed  Result = "passed"
	Failed  Result = "failed"
	Skipped Result = "skipped"
	// NotRun: the test is absent from that run's report.
	NotRun Result = ""
)

// Case is one test case of a JUnit report.
type Case struct {
	// Name is the spec's full text, without ginkgo's "[It] " prefix.
	Name   string
	Result Result
	// Seconds the spec ran.
	Seconds float64
	// Message is the skip reason or the first line of the failure.
	Message string
}

// junitSuites is the part of ginkgo's JUnit XML the tables read.
type junitSuites struct {
	Suites []struct {
		Cases []struct {
			Name    string  `xml:"name,attr"`
			Status  string  `xml:"status,attr"`
			Time    float64 `xml:"time,attr"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
			Failure *struct {
				Message string `xml:"message,attr"`
				Text    string `xml:",chardata"`
			} `xml:"failure"`
			Error *struct {
				Message string `xml:"message,attr"`
				Text    string `xml:",chardata"`
			} `xml:"error"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// ReadJUnit reads the test cases of e2e.test's JUnit report (junit_01.xml
// in its --report-dir). Only the specs the run selected are returned: the
// report lists every spec of the suite, those --ginkgo.focus/skip left out
// as skipped with the bare message "skipped" (a test that skips itself
// says why: "skipped - REASON"); the suite's set-up and report nodes
// ("[SynchronizedBeforeSuite]", ...) are not tests.
func ReadJUnit(path string) ([]Case, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseJUnit(b)
}

// ParseJUnit parses a JUnit report; see ReadJUnit.
func ParseJUnit(b []byte) ([]Case, error) {
	var s junitSuites
	if err := xml.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("parsing JUnit report: %w", err)
	}
	var cases []Case
	for _, suite := range s.Suites {
		for _, tc := range suite.Cases {
			name, ok := strings.CutPrefix(tc.Name, "[It] ")
			if !ok {
				continue
			}
			c := Case{Name: name, Seconds: tc.Time, Result: result(tc.Status)}
			switch {
			case tc.Skipped != nil:
				c.Message = tc.Skipped.Message
			case tc.Failure != nil:
				c.Message = firstLine(tc.Failure.Message, tc.Failure.Text)
			case tc.Error != nil:
				c.Message = firstLine(tc.Error.Message, tc.Error.Text)
			}
			if c.Result == Skipped && c.Message == notSelected {
				continue
			}
			cases = append(cases, c)
		}
	}
	return cases, nil
}

// notSelected is the skip message of a spec the run's focus and skip
// patterns left out.
const notSelected = "skipped"

// result maps ginkgo's spec states onto Passed, Failed and Skipped.
func result(status string) Result {
	switch status {
	case "passed":
		return Passed
	case "skipped", "pending":
		return Skipped
	default:
		return Failed
	}
}

// firstLine is the first non-empty line of the first non-empty text.
func firstLine(texts ...string) string {
	for _, t := range texts {
		for l := range strings.SplitSeq(t, "\n") {
			if l = strings.TrimSpace(l); l != "" {
				return l
			}
		}
	}
	return ""
}
