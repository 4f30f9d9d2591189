package netns

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ModuleRoot returns the directory of the main module of the working
// directory (`go env GOMOD`).
func ModuleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("not inside a Go module")
	}
	return filepath.Dir(gomod), nil
}

// BuildBinary builds the main package pkg (relative to the module root, e.g.
// "./cmd/kproxy") into dir and returns the binary's path. Test binaries call
// it once, from TestMain.
func BuildBinary(pkg, dir string) (string, error) {
	return BuildBinaryTags(pkg, dir, "")
}

// BuildBinaryTags is BuildBinary with build tags (comma-separated; "" for
// none); the binary's name gets the tags as a suffix.
func BuildBinaryTags(pkg, dir, tags string) (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, filepath.Base(pkg))
	args := []string{"build", "-o", out}
	if tags != "" {
		out += "-" + strings.ReplaceAll(tags, ",", "-")
		args = []string{"build", "-tags", tags, "-o", out}
	}
	cmd := exec.Command("go", append(args, pkg)...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return out, nil
}
