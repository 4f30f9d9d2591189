package main

import (
	"strings"
	"testing"
)

func TestCounts(t *testing.T) {
	in := strings.Join([]string{
		`{"Action":"run","Package":"p","Test":"TestA"}`,
		`{"Action":"pass","Package":"p","Test":"TestA/sub"}`,
		`{"Action":"pass","Package":"p","Test":"TestA"}`,
		`{"Action":"skip","Package":"p","Test":"TestB"}`,
		`{"Action":"fail","Package":"p","Test":"TestC"}`,
		`{"Action":"fail","Package":"p"}`,
		`not json: go vet output`,
		`{"Action":"fail","Package":"q"}`,
		`{"Action":"pass","Package":"r"}`,
	}, "\n")
	var c counts
	if err := c.read(strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	if c.passed != 2 || c.failed != 2 || c.skipped != 1 {
		t.Fatalf("passed %d failed %d skipped %d, want 2 2 1", c.passed, c.failed, c.skipped)
	}
	want := []string{"p TestC", "q (package failed: build error, panic or timeout)"}
	if strings.Join(c.failures, "|") != strings.Join(want, "|") {
		t.Fatalf("failures %q, want %q", c.failures, want)
	}
}
