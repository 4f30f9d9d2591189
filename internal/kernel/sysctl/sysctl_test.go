package sysctl

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestFiles(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "nf_conntrack_max")
	if err := os.WriteFile(p, []byte("65536\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var f Files
	if v, err := f.Get(p); err != nil || v != 65536 {
		t.Fatalf("Get = %d, %v", v, err)
	}
	if err := f.Set(p, 131072); err != nil {
		t.Fatal(err)
	}
	if v, err := f.Get(p); err != nil || v != 131072 {
		t.Fatalf("after Set: Get = %d, %v", v, err)
	}
	// A parameter that does not exist is not created.
	missing := filepath.Join(dir, "hashsize")
	if err := f.Set(missing, 1); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Set on a missing parameter: %v", err)
	}
	if _, err := os.Stat(missing); err == nil {
		t.Error("Set created a missing parameter")
	}
	if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Get(p); err == nil {
		t.Error("Get of a non-number succeeded")
	}
}
