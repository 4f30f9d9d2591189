package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// committed is the generated file kproxy builds with.
var committed = filepath.Join("..", "..", "..", "..", "internal", "config", "zz_generated_featuregates.go")

// TestCommittedFileIsCurrent fails when kproxy's gate table differs from
// what the k8s.io/kubernetes of this module's go.mod accepts. Fix with
// `go generate ./internal/config` from the repository root.
func TestCommittedFileIsCurrent(t *testing.T) {
	want, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(committed)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) == string(got) {
		return
	}
	wl, gl := strings.Split(string(want), "\n"), strings.Split(string(got), "\n")
	for i := 0; i < max(len(wl), len(gl)); i++ {
		var w, g string
		if i < len(wl) {
			w = wl[i]
		}
		if i < len(gl) {
			g = gl[i]
		}
		if w != g {
			t.Fatalf("%s is stale (run `go generate ./internal/config`); first difference at line %d:\nupstream:  %q\ncommitted: %q", committed, i+1, w, g)
		}
	}
}
