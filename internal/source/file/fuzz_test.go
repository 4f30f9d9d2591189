package file_test

// FuzzLoad fuzzes the bytes of a snapshot file, read as the source reads
// it (Load of a file, with its file-level faults) and fed to a Tracker as
// the source feeds it. Whatever the bytes, nothing panics, and:
//   - every error is a *DocumentError or a *FileError with a message and,
//     for a FileError, one of the fixed reasons; a file with a fault gives
//     no object (the objects it gave before are kept by the watcher);
//   - every object kept has a kind the source reads, a name, and a key
//     found once;
//   - the model uses each Service, or skips it for a stated rule, or
//     reports it by name with a non-empty reason.
//
// Addresses of the seeds: 198.18.0.0/16 nodes and pods, 198.19.0.0/16
// service IPs, fd00::/8 IPv6. Seeds: f.Add below (the built-in example and
// small hand-made files) plus testdata/fuzz/FuzzLoad.

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/source/file"
	"github.com/kproxy/kproxy/internal/testutil/fuzzsnap"
)

// objectKey identifies an object read.
type objectKey struct{ kind, namespace, name string }

const fuzzService = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: ns}
spec:
  clusterIP: 198.19.0.1
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: ns, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: [198.18.1.1], conditions: {ready: true}, nodeName: node-a}]
ports: [{name: http, port: 8080, protocol: TCP}]
---
apiVersion: v1
kind: Node
metadata: {name: node-a}
spec: {podCIDR: 198.18.1.0/24}
status: {addresses: [{type: InternalIP, address: 198.18.0.10}]}
`

func FuzzLoad(f *testing.F) {
	fuzzsnap.Quiet()
	f.Add(example.YAML)
	for _, s := range []string{
		fuzzService,
		`{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Service","metadata":{"name":"a"},"spec":{"clusterIP":"198.19.0.2","ports":[{"port":0}]}}]}`,
		`{"kind":"Service","metadata":{"name":"a"}}{"kind":"Service","metadata":{"name":"a"}}`,
		"apiVersion: v1\nitems:\n- kind: Service\n  metadata: {name: x}\n",
		"kind: Service\nmetadata: {name: \"a\\\"b\\n-A X\", namespace: \"ü\"}\nspec: {clusterIP: 198.19.0.3, ports: [{port: 65536, nodePort: -1, protocol: ICMP}]}\n",
		"kind: EndpointSlice\nmetadata: {name: s}\naddressType: IPv4\nendpoints: [{addresses: [\"fd00::1\", \"x\"]}]\n",
		"kind: Node\nmetadata: {name: node-a}\nstatus: {addresses: [{type: InternalIP, address: 1.2.3}]}\n",
		"--- \n---\n# only a comment\n", "", "\xef\xbb\xbf[", "a: b: c", "kind: [", "[1,2]\n", "null", "kind: Service\nmetadata: 3\n",
		"kind: Service\nmetadata: {name: a}\nspec: {ports: \"x\"}\n", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n",
	} {
		f.Add([]byte(s))
	}
	path := filepath.Join(f.TempDir(), "snapshot.yaml")
	reasons := map[string]bool{}
	for _, r := range file.Reasons {
		reasons[r] = true
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		objs, errs := file.Load(path)
		faulty := false
		for _, err := range errs {
			var de *file.DocumentError
			var fe *file.FileError
			switch {
			case errors.As(err, &fe):
				faulty = true
				if !reasons[fe.Reason] || fe.Err == nil || strings.TrimSpace(fe.Err.Error()) == "" {
					t.Errorf("file error without a reason or a message: %#v", fe)
				}
			case errors.As(err, &de):
				if de.Err == nil || strings.TrimSpace(de.Err.Error()) == "" || de.Document < 1 || !strings.HasPrefix(de.Error(), path) {
					t.Errorf("document error without a message, a document or the file: %q", de.Error())
				}
			default:
				t.Errorf("error of type %T: %v", err, err)
			}
		}
		n := len(objs.Services) + len(objs.EndpointSlices) + len(objs.Nodes)
		if faulty && n > 0 {
			t.Errorf("a faulty file gave %d objects", n)
		}
		seen := map[objectKey]bool{}
		key := func(kind, ns, name string) {
			k := objectKey{kind, ns, name}
			if name == "" || seen[k] {
				t.Errorf("%s: no name, or found twice", k)
			}
			seen[k] = true
		}
		for _, s := range objs.Services {
			key("Service", s.Namespace, s.Name)
		}
		for _, s := range objs.EndpointSlices {
			key("EndpointSlice", s.Namespace, s.Name)
		}
		for _, s := range objs.Nodes {
			key("Node", "", s.Name)
			if s.Namespace != "" {
				t.Errorf("node %s has namespace %q", s.Name, s.Namespace)
			}
		}

		reported := map[string]bool{}
		tr := model.NewTracker(model.TrackerOptions{Hostname: example.NodeA, Families: []v1.IPFamily{model.IPv4, model.IPv6},
			OnInvalid: func(e *model.InvalidError) {
				if strings.TrimSpace(e.Reason) == "" || e.Category == "" {
					t.Errorf("report without a reason: %#v", e)
				}
				reported[e.Kind+" "+e.Object] = true
			}})
		objs.Feed(tr)
		u := tr.Take()
		used := map[types.NamespacedName]bool{}
		for _, d := range u.Families {
			for n, sp := range d.Services {
				if sp != nil {
					used[n.NamespacedName] = true
				}
			}
		}
		for _, s := range objs.Services {
			k := types.NamespacedName{Namespace: s.Namespace, Name: s.Name}
			if !used[k] && model.SkipService(s) == "" && !reported["Service "+k.String()] {
				t.Errorf("service %s neither used nor reported as skipped", k)
			}
		}
		// The same bytes read again give the same objects.
		again, errs2 := file.Load(path)
		if len(errs2) != len(errs) || len(again.Services) != len(objs.Services) ||
			len(again.EndpointSlices) != len(objs.EndpointSlices) || len(again.Nodes) != len(objs.Nodes) {
			t.Errorf("a second read differs: %d/%d errors, %d/%d services", len(errs2), len(errs), len(again.Services), len(objs.Services))
		}
	})
}
