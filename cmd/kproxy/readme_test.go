package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeLayout: the Layout section of the README names every Go
// package of the repository (both tool modules included), and every folder
// it names exists, so it cannot fall behind the tree.
//
// A package is named either by a tree line ("internal/proxy/" or, indented
// under it, "  nftables/") or, for a small package beside its parent, by
// "name/" in the description of its parent's line ("nft/ ... nfttest/ its
// fake").
func TestReadmeLayout(t *testing.T) {
	root := filepath.Join("..", "..")
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	block := layoutBlock(t, string(readme))

	named := map[string]bool{}   // every folder the section names
	entries := map[string]bool{} // the tree lines' own folders
	var stack []string           // folder of each indentation level
	var last string
	inline := regexp.MustCompile(`(?:^|\s)([a-z0-9_./-]+)/(?:\s|$|,)`)
	for _, line := range strings.Split(block, "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		indent := len(line) - len(strings.TrimLeft(line, " "))
		fields := strings.Fields(line)
		if indent < 24 && strings.HasSuffix(fields[0], "/") {
			level := indent / 2
			if level > len(stack) {
				t.Fatalf("README layout line %q is indented deeper than its parent", line)
			}
			stack = append(stack[:level], strings.TrimSuffix(fields[0], "/"))
			last = filepath.Join(stack...)
			named[last], entries[last] = true, true
			fields = fields[1:]
		}
		// Description (also continuation lines): "name/" mentions are
		// folders beside or below the current entry.
		for _, m := range inline.FindAllStringSubmatch(" "+strings.Join(fields, " ")+" ", -1) {
			named[filepath.Join(last, m[1])] = true
		}
	}

	for dir := range entries {
		if fi, err := os.Stat(filepath.Join(root, dir)); err != nil || !fi.IsDir() {
			t.Errorf("README's Layout names %s/, which is not a folder", dir)
		}
	}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		dir, _ := filepath.Rel(root, filepath.Dir(path))
		if dir != "." && !named[dir] {
			named[dir] = true // report each folder once
			t.Errorf("README's Layout does not name the package %s/ (add a line for it)", dir)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// layoutBlock returns the code block of the README's "## Layout" section.
func layoutBlock(t *testing.T, readme string) string {
	t.Helper()
	_, sec, ok := strings.Cut(readme, "\n## Layout\n")
	if !ok {
		t.Fatal("README has no ## Layout section")
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	_, block, ok := strings.Cut(sec, "```\n")
	if !ok {
		t.Fatal("README's Layout section has no code block")
	}
	block, _, ok = strings.Cut(block, "```")
	if !ok {
		t.Fatal("README's Layout code block is not closed")
	}
	return block
}
