package config

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"
)

// The config file watch ends kproxy on an edit in place, on a rename over
// the file, and on a ConfigMap volume update (the ..data symlink is swapped
// and the old directory removed); a touch of another file does not.
func TestWatchConfigFile(t *testing.T) {
	write := func(t *testing.T, p, s string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		name   string
		setup  func(t *testing.T, dir string) string // returns the --config path
		change func(t *testing.T, dir string)
	}{{
		name:   "edit in place",
		setup:  func(t *testing.T, dir string) string { write(t, dir+"/c.yaml", "a"); return dir + "/c.yaml" },
		change: func(t *testing.T, dir string) { write(t, dir+"/c.yaml", "b") },
	}, {
		name:  "rename over",
		setup: func(t *testing.T, dir string) string { write(t, dir+"/c.yaml", "a"); return dir + "/c.yaml" },
		change: func(t *testing.T, dir string) {
			write(t, dir+"/new", "b")
			if err := os.Rename(dir+"/new", dir+"/c.yaml"); err != nil {
				t.Fatal(err)
			}
		},
	}, {
		name: "ConfigMap volume update",
		setup: func(t *testing.T, dir string) string {
			must(t, os.Mkdir(dir+"/..v1", 0o755))
			write(t, dir+"/..v1/config.conf", "a")
			must(t, os.Symlink("..v1", dir+"/..data"))
			must(t, os.Symlink("..data/config.conf", dir+"/config.conf"))
			return dir + "/config.conf"
		},
		change: func(t *testing.T, dir string) {
			// What the kubelet's atomic writer does.
			must(t, os.Mkdir(dir+"/..v2", 0o755))
			write(t, dir+"/..v2/config.conf", "b")
			must(t, os.Symlink("..v2", dir+"/..data_tmp"))
			must(t, os.Rename(dir+"/..data_tmp", dir+"/..data"))
			must(t, os.RemoveAll(dir+"/..v1"))
		},
	}} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := tt.setup(t, dir)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := make(chan error, 1)
			if err := WatchFile(ctx, path, errc); err != nil {
				t.Fatal(err)
			}
			write(t, dir+"/unrelated", "x")
			select {
			case err := <-errc:
				t.Fatalf("before any change: %v", err)
			case <-time.After(200 * time.Millisecond):
			}
			tt.change(t, dir)
			select {
			case err := <-errc:
				if !errors.Is(err, ErrFileChanged) {
					t.Fatalf("got %v, want ErrFileChanged", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("no exit within 5s of the change")
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
