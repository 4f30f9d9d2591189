package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDocNotes: doc --notes appends the notes to the tables and names
// them in the command the document says made it.
func TestDocNotes(t *testing.T) {
	dir := t.TempDir()
	report := filepath.Join(dir, "report")
	if err := os.Mkdir(report, 0o755); err != nil {
		t.Fatal(err)
	}
	junit, err := os.ReadFile("../../testdata/junit_sample.xml")
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{
		filepath.Join(report, "junit_01.xml"): junit,
		filepath.Join(report, "run.json"): []byte(`{"selection":"conformance-services","proxy":"kproxy","mode":"nftables",` +
			`"started":"2026-01-01T00:00:00Z","finished":"2026-01-01T00:01:00Z"}`),
		filepath.Join(dir, "notes.md"): []byte("## Environment\n\nThree nodes on one host.\n"),
	} {
		if err := os.WriteFile(name, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "conformance.md")
	cmd := newRootCommand()
	cmd.SetArgs([]string{"doc", "-o", out, "--notes", filepath.Join(dir, "notes.md"), report})
	cmd.SetErr(new(strings.Builder))
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	if !strings.HasSuffix(doc, "\n## Environment\n\nThree nodes on one host.\n") {
		t.Errorf("the notes do not end the document:\n%s", doc)
	}
	if !strings.Contains(doc, "`hack/conformance.sh doc --notes "+filepath.Join(dir, "notes.md")+" "+report+"`") {
		t.Errorf("the document does not name the notes in its command:\n%s", doc)
	}
	if !strings.Contains(doc, "| nftables | kproxy | conformance-services |") {
		t.Errorf("the run is missing:\n%s", doc)
	}
}
