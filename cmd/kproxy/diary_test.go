package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// diaryPatterns are the marks of a document that tells how the work went
// instead of what the software does: numbered or relative work sessions
// anywhere, and in Markdown a heading that carries a date or a date with a
// time of day (a dated run). Earlier runs live in git history; docs state
// today's figures and their commands.
var diaryPatterns = []struct {
	re       *regexp.Regexp
	markdown bool // checked in Markdown files only
}{
	{re: regexp.MustCompile(`(?i)\bsession \d+\b`)},
	{re: regexp.MustCompile(`(?i)\b(this|an earlier|the earlier|the previous|the same) session\b`)},
	{re: regexp.MustCompile(`(?m)^#{1,6} .*\b20\d\d-\d\d-\d\d\b`), markdown: true},
	{re: regexp.MustCompile(`\b20\d\d-\d\d-\d\d[ ,]+\d\d:\d\d\b`), markdown: true},
}

// diaryMark returns the first diary mark in text, or "".
func diaryMark(text string, markdown bool) string {
	for _, p := range diaryPatterns {
		if p.markdown && !markdown {
			continue
		}
		if m := p.re.FindString(text); m != "" {
			return m
		}
	}
	return ""
}

func TestDiaryMarkPatterns(t *testing.T) {
	for _, c := range []struct {
		text     string
		markdown bool
		want     bool
	}{
		{"### S" + "ession 12 (quiet): memory", true, true},
		{"figures of s" + "ession 11", false, true},
		{"measured in thi" + "s session", false, true},
		{"as an earlie" + "r session showed", true, true},
		{"## Side by side (20" + "26-12-04, quiet)", true, true},
		{"the run of 20" + "26-12-04 06:23 UTC", true, true},
		{"a long-lived TCP session to the service", false, false},
		{"Session is a long-lived TCP connection", false, false},
		{"sessionAffinity: ClientIP, session affinity 600 s", false, false},
		{"OpenSession(dst, netns.DialOptions{})", false, false},
		{`annotation: "2026-01-02T03:04:05Z"`, false, false},
		{`r.Started.Format("2006-01-02 15:04")`, false, false},
		{"## Benchmarks", true, false},
	} {
		if got := diaryMark(c.text, c.markdown) != ""; got != c.want {
			t.Errorf("%q (markdown %v): diary mark %v, want %v", c.text, c.markdown, got, c.want)
		}
	}
}

// TestNoDiary: no document, README, Go source or script of the repository
// reads as a diary of dated runs or work sessions.
func TestNoDiary(t *testing.T) {
	root := filepath.Join("..", "..")
	self, err := filepath.Abs("diary_test.go")
	if err != nil {
		t.Fatal(err)
	}
	var md, goFiles int
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "_output" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		markdown := strings.HasSuffix(name, ".md")
		switch {
		case markdown:
			md++
		case strings.HasSuffix(name, ".go"):
			goFiles++
		case strings.HasSuffix(name, ".sh"), name == "Dockerfile":
		default:
			return nil
		}
		if abs, _ := filepath.Abs(path); abs == self {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			if m := diaryMark(line, markdown); m != "" {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("%s:%d reads as a diary (%q): state what the software does and how it is measured", rel, i+1, m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if md < 5 || goFiles < 100 {
		t.Fatalf("walked %d Markdown and %d Go files: not the repository", md, goFiles)
	}
}
