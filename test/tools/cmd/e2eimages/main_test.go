package main

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	imageutils "k8s.io/kubernetes/test/utils/image"
)

// notBuilt are images the sources below use that the cluster does not
// hold, with the reason.
var notBuilt = map[string]string{
	"GlibcDnsTesting": "DNS tests only ([sig-network] DNS), which need cluster DNS and are not selected",
}

// networkSources are the packages whose images the selected tests run: the
// sig-network tests themselves and the framework helpers they make pods
// with.
var networkSources = []string{
	"test/e2e/network",
	"test/e2e/framework/network",
	"test/e2e/framework/service",
	"test/e2e/framework/pod",
}

// TestImagesCoverNetworkTests: every image ID the sig-network tests and
// their framework helpers name is in images, or in notBuilt with a reason.
func TestImagesCoverNetworkTests(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes").Output()
	if err != nil {
		t.Fatalf("go list -m k8s.io/kubernetes: %v", err)
	}
	mod := strings.TrimSpace(string(out))
	ids := imageIDs(t, filepath.Join(mod, "test/utils/image/manifest.go"))
	if ids["Agnhost"] != imageutils.Agnhost || ids["Pause"] != imageutils.Pause {
		t.Fatalf("reading manifest.go's ImageID constants went wrong: Agnhost=%d Pause=%d", ids["Agnhost"], ids["Pause"])
	}
	built := map[imageutils.ImageID]bool{}
	for _, im := range images {
		built[im.id] = true
	}
	used := map[string]bool{}
	ref := regexp.MustCompile(`imageutils\.(\w+)`)
	for _, dir := range networkSources {
		files, err := filepath.Glob(filepath.Join(mod, dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src := readFile(t, f)
			for _, m := range ref.FindAllStringSubmatch(src, -1) {
				if _, ok := ids[m[1]]; ok && m[1] != "None" {
					used[m[1]] = true
				}
			}
		}
	}
	if !used["Agnhost"] || !used["BusyBox"] {
		t.Fatalf("found only %v in %v: the scan is broken", used, networkSources)
	}
	for name := range used {
		if !built[ids[name]] && notBuilt[name] == "" {
			t.Errorf("the sig-network tests use imageutils.%s (%s), which is neither built nor listed in notBuilt", name, imageutils.GetE2EImage(ids[name]))
		}
	}
	for name := range notBuilt {
		if built[ids[name]] {
			t.Errorf("%s is built and also listed in notBuilt", name)
		}
	}
	var keys []string
	for _, im := range images {
		if slices.Contains(keys, im.key) {
			t.Errorf("key %s twice", im.key)
		}
		keys = append(keys, im.key)
	}
}

// imageIDs reads the ImageID constants of manifest.go: the const block
// whose first constant is "None ImageID = iota".
func imageIDs(t *testing.T, path string) map[string]imageutils.ImageID {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]imageutils.ImageID{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST || len(g.Specs) == 0 {
			continue
		}
		first := g.Specs[0].(*ast.ValueSpec)
		if typ, ok := first.Type.(*ast.Ident); !ok || typ.Name != "ImageID" {
			continue
		}
		for i, s := range g.Specs {
			for _, n := range s.(*ast.ValueSpec).Names {
				ids[n.Name] = imageutils.ImageID(i)
			}
		}
	}
	return ids
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestArchivesNamed checks the archives test/tools/images.sh wrote (in
// KPROXY_IMAGES_DIR, else _output/images of the repository): images.txt
// lists one for every image, and each archive's index names its one image
// with that name in both annotations importers read, so `ctr images
// import` stores it as the framework asks for it. Skipped when the images
// are not built, a failure where KPROXY_E2E=1.
func TestArchivesNamed(t *testing.T) {
	dir := os.Getenv("KPROXY_IMAGES_DIR")
	if dir == "" {
		dir = filepath.Join("..", "..", "..", "..", "_output", "images")
	}
	list, err := os.ReadFile(filepath.Join(dir, "images.txt"))
	if err != nil {
		if os.Getenv("KPROXY_E2E") == "1" {
			t.Fatalf("no images: %v (test/tools/images.sh builds them)", err)
		}
		t.Skipf("no images: %v (test/tools/images.sh builds them)", err)
	}
	archives := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(list)), "\n") {
		name, archive, ok := strings.Cut(line, " ")
		if !ok {
			t.Fatalf("images.txt: bad line %q", line)
		}
		archives[name] = archive
	}
	for _, im := range append(images, coreDNS) {
		name := im.fullName()
		archive, ok := archives[name]
		if !ok {
			t.Errorf("images.txt lists no archive of %s", name)
			continue
		}
		index := readIndex(t, filepath.Join(dir, archive))
		if len(index.Manifests) != 1 {
			t.Errorf("%s: %d images in the index, want 1", archive, len(index.Manifests))
			continue
		}
		for _, a := range []string{"io.containerd.image.name", "org.opencontainers.image.ref.name"} {
			if got := index.Manifests[0].Annotations[a]; got != name {
				t.Errorf("%s: annotation %s = %q, want %q", archive, a, got, name)
			}
		}
	}
}

// ociIndex is the part of an OCI image index the test reads.
type ociIndex struct {
	Manifests []struct {
		Annotations map[string]string `json:"annotations"`
	} `json:"manifests"`
}

// readIndex reads index.json of an OCI archive (images.sh packs the
// layout as ./...).
func readIndex(t *testing.T, path string) ociIndex {
	t.Helper()
	b, err := exec.Command("tar", "-xOf", path, "./index.json").Output()
	if err != nil {
		t.Fatalf("%s: reading index.json: %v", path, err)
	}
	var idx ociIndex
	if err := json.Unmarshal(b, &idx); err != nil {
		t.Fatalf("%s: index.json: %v", path, err)
	}
	return idx
}
