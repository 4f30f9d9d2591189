package file

// Addresses used in these tests:
//   198.18.0.10                 node-a (node IP)
//   198.18.129.0/24             pods on node-a
//   198.19.0.0/16               service cluster IPs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/kproxy/kproxy/internal/metrics"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// kubectlList is what `kubectl get svc,endpointslices,nodes,cm -A -o yaml`
// writes, cut down, with a field our API types do not know.
const kubectlList = `apiVersion: v1
items:
- apiVersion: v1
  kind: Service
  metadata:
    creationTimestamp: "2026-01-15T10:00:00Z"
    labels:
      app: web
    name: web
    namespace: demo
    resourceVersion: "1001"
    uid: 00000000-0000-4000-8000-000000000001
  spec:
    clusterIP: 198.19.0.10
    clusterIPs:
    - 198.19.0.10
    ipFamilies:
    - IPv4
    ipFamilyPolicy: SingleStack
    ports:
    - name: http
      port: 80
      protocol: TCP
      targetPort: 8080
    selector:
      app: web
    someFieldFromTheFuture: true
    type: ClusterIP
  status:
    loadBalancer: {}
- addressType: IPv4
  apiVersion: discovery.k8s.io/v1
  endpoints:
  - addresses:
    - 198.18.129.10
    conditions:
      ready: true
      serving: true
      terminating: false
    nodeName: node-a
    zone: zone-a
  kind: EndpointSlice
  metadata:
    annotations:
      endpoints.kubernetes.io/last-change-trigger-time: "2026-01-15T10:00:05Z"
    labels:
      kubernetes.io/service-name: web
    name: web-7x2kq
    namespace: demo
    resourceVersion: "1002"
  ports:
  - name: http
    port: 8080
    protocol: TCP
- apiVersion: v1
  kind: Node
  metadata:
    labels:
      topology.kubernetes.io/zone: zone-a
    name: node-a
    resourceVersion: "1003"
  spec:
    podCIDR: 198.18.129.0/24
    podCIDRs:
    - 198.18.129.0/24
  status:
    addresses:
    - address: 198.18.0.10
      type: InternalIP
- apiVersion: v1
  data:
    key: value
  kind: ConfigMap
  metadata:
    name: ignored
    namespace: demo
kind: List
metadata:
  resourceVersion: ""
`

// summary names the objects found, in order, for comparisons.
func summary(o *Objects) []string {
	var out []string
	for _, s := range o.Services {
		out = append(out, "Service "+s.Namespace+"/"+s.Name)
	}
	for _, s := range o.EndpointSlices {
		out = append(out, "EndpointSlice "+s.Namespace+"/"+s.Name)
	}
	for _, n := range o.Nodes {
		out = append(out, "Node "+n.Name)
	}
	return out
}

func TestParseKubectlList(t *testing.T) {
	objs, errs := Parse("state.yaml", []byte(kubectlList))
	if len(errs) != 0 {
		t.Fatalf("errors: %v", errs)
	}
	want := []string{"Service demo/web", "EndpointSlice demo/web-7x2kq", "Node node-a"}
	if diff := cmp.Diff(want, summary(objs)); diff != "" {
		t.Fatalf("objects (-want +got):\n%s", diff)
	}
	// The typed fields really are decoded.
	svc := objs.Services[0]
	if svc.Spec.ClusterIP != "198.19.0.10" || svc.Spec.Ports[0].Port != 80 || svc.Spec.Ports[0].TargetPort.IntValue() != 8080 ||
		svc.ResourceVersion != "1001" || svc.Labels["app"] != "web" ||
		// The creation time decides who keeps a contested address.
		svc.CreationTimestamp.Unix() != 1768471200 {
		t.Errorf("service decoded as %+v", svc)
	}
	sl := objs.EndpointSlices[0]
	if sl.AddressType != discovery.AddressTypeIPv4 || len(sl.Endpoints) != 1 || *sl.Endpoints[0].NodeName != "node-a" ||
		*sl.Endpoints[0].Zone != "zone-a" || !*sl.Endpoints[0].Conditions.Ready || *sl.Ports[0].Port != 8080 ||
		sl.Labels[discovery.LabelServiceName] != "web" {
		t.Errorf("slice decoded as %+v", sl)
	}
	n := objs.Nodes[0]
	if n.Spec.PodCIDRs[0] != "198.18.129.0/24" || n.Status.Addresses[0].Address != "198.18.0.10" || n.Labels[v1.LabelTopologyZone] != "zone-a" {
		t.Errorf("node decoded as %+v", n)
	}
}

func TestParseFormats(t *testing.T) {
	tests := []struct {
		name string
		file string
		data string
		want []string
	}{{
		name: "multi-document YAML with separators, comments, an empty document and an end marker",
		file: "multi.yaml",
		data: `---
# the web service
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec: {clusterIP: 198.19.0.10, ports: [{port: 80}]}
---
# nothing here
---   # a separator with a comment
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: demo
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
...
---
apiVersion: v1
kind: Node
metadata:
  name: node-a
`,
		want: []string{"Service demo/web", "EndpointSlice demo/web-1", "Node node-a"},
	}, {
		name: "single object, namespace defaulted",
		file: "one.yml",
		data: "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  clusterIP: 198.19.0.10\n",
		want: []string{"Service default/web"},
	}, {
		name: "API list kind (ServiceList) as the API server returns it",
		file: "svc.yaml",
		data: "apiVersion: v1\nkind: ServiceList\nitems:\n- metadata: {name: a, namespace: demo}\n  kind: Service\n- metadata: {name: b, namespace: demo}\n  kind: Service\n",
		want: []string{"Service demo/a", "Service demo/b"},
	}, {
		name: "empty list",
		file: "empty.yaml",
		data: "apiVersion: v1\nkind: List\nitems: []\n",
	}, {
		name: "JSON list as kubectl -o json writes it",
		file: "state.json",
		data: `{
    "apiVersion": "v1",
    "items": [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web", "namespace": "demo"},
            "spec": {"clusterIP": "198.19.0.10", "ports": [{"port": 80, "protocol": "TCP"}]}
        },
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "node-a"}
        }
    ],
    "kind": "List",
    "metadata": {"resourceVersion": ""}
}
`,
		want: []string{"Service demo/web", "Node node-a"},
	}, {
		name: "JSON values one after the other",
		file: "stream.json",
		data: `{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a", "namespace": "demo"}}
{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "b", "namespace": "demo"}}`,
		want: []string{"Service demo/a", "Service demo/b"},
	}, {
		name: "YAML flow style in a .yaml file",
		file: "flow.yaml",
		data: "{apiVersion: v1, kind: Node, metadata: {name: node-a}}\n",
		want: []string{"Node node-a"},
	}, {
		name: "other kinds ignored without error",
		file: "other.yaml",
		data: "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, namespace: demo}\n---\napiVersion: v1\nkind: Endpoints\nmetadata: {name: x, namespace: demo}\n",
	}, {
		name: "byte order mark and CRLF line ends",
		file: "windows.yaml",
		data: "\xef\xbb\xbfapiVersion: v1\r\nkind: Node\r\nmetadata:\r\n  name: node-a\r\n---\r\napiVersion: v1\r\nkind: Node\r\nmetadata:\r\n  name: node-b\r\n",
		want: []string{"Node node-a", "Node node-b"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs, errs := Parse(tc.file, []byte(tc.data))
			if len(errs) != 0 {
				t.Fatalf("errors: %v", errs)
			}
			if diff := cmp.Diff(tc.want, summary(objs)); diff != "" {
				t.Errorf("objects (-want +got):\n%s", diff)
			}
		})
	}
}

// badMulti has a good document, an unparseable one, and a good one.
const badMulti = `apiVersion: v1
kind: Service
metadata:
  name: first
  namespace: demo
---
apiVersion: v1
kind: Service
metadata:
  name: broken
  labels: [unclosed
---
apiVersion: v1
kind: Service
metadata:
  name: third
  namespace: demo
`

// badList is a List whose items 1, 2, 3, 5 and 6 are bad, as their names say.
const badList = `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata:
    name: good
    namespace: demo
- apiVersion: v1
  kind: Service
  metadata:
    name: port-is-a-word
    namespace: demo
  spec:
    ports:
    - port: http
- apiVersion: v1
  kind: Service
  metadata:
    namespace: demo
  spec:
    clusterIP: 198.19.0.11
- apiVersion: v1
  metadata:
    name: no-kind
    namespace: demo
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata:
    name: good-1
    namespace: demo
    labels:
      kubernetes.io/service-name: good
  addressType: IPv4
- apiVersion: discovery.k8s.io/v1beta1
  kind: EndpointSlice
  metadata:
    name: old-api
    namespace: demo
  addressType: IPv4
- apiVersion: v1
  kind: Service
  metadata:
    name: good
    namespace: demo
`

func TestParseBad(t *testing.T) {
	tests := []struct {
		name     string
		file     string
		data     string
		wantObjs []string
		// Errors: the position fields, and a fragment of the message.
		wantErrs []DocumentError
		wantMsgs []string
	}{{
		name:     "unparseable document among good ones",
		file:     "multi.yaml",
		data:     badMulti,
		wantObjs: []string{"Service demo/first", "Service demo/third"},
		wantErrs: []DocumentError{{File: "multi.yaml", Document: 2, Item: -1, Line: 7}},
		wantMsgs: []string{"invalid YAML: yaml: line 11: did not find expected"},
	}, {
		name:     "bad items in a list",
		file:     "list.yaml",
		data:     badList,
		wantObjs: []string{"Service demo/good", "EndpointSlice demo/good-1"},
		wantErrs: []DocumentError{
			{File: "list.yaml", Document: 1, Item: 1, Line: 9, Kind: "Service", Namespace: "demo", Name: "port-is-a-word"},
			{File: "list.yaml", Document: 1, Item: 2, Line: 17, Kind: "Service", Namespace: "demo"},
			{File: "list.yaml", Document: 1, Item: 3, Line: 23, Namespace: "demo", Name: "no-kind"},
			{File: "list.yaml", Document: 1, Item: 5, Line: 35, Kind: "EndpointSlice", Namespace: "demo", Name: "old-api"},
			{File: "list.yaml", Document: 1, Item: 6, Line: 41, Kind: "Service", Namespace: "demo", Name: "good"},
		},
		wantMsgs: []string{
			"list.yaml:9: document 1, items[1]: Service demo/port-is-a-word: json: cannot unmarshal string into Go struct field ServicePort.spec.ports.port of type int32",
			"list.yaml:17: document 1, items[2]: Service (no name): no metadata.name",
			"list.yaml:23: document 1, items[3]: object demo/no-kind: no kind",
			`apiVersion "discovery.k8s.io/v1beta1" not supported for EndpointSlice`,
			"duplicate Service demo/good, already read at list.yaml: document 1, items[0]",
		},
	}, {
		name:     "document that is not a mapping, then a good one",
		file:     "scalar.yaml",
		data:     "just a string\n---\napiVersion: v1\nkind: Node\nmetadata: {name: node-a}\n",
		wantErrs: []DocumentError{{File: "scalar.yaml", Document: 1, Item: -1, Line: 1}},
		wantMsgs: []string{"not an object"},
		wantObjs: []string{"Node node-a"},
	}, {
		name:     "broken JSON stream keeps what came before",
		file:     "stream.json",
		data:     "{\"kind\": \"Node\", \"metadata\": {\"name\": \"a\"}}\n\n{\"kind\": \"Node\", \"metadata\": {\"name\": }\n",
		wantObjs: []string{"Node a"},
		wantErrs: []DocumentError{{File: "stream.json", Document: 2, Item: -1, Line: 3}},
		wantMsgs: []string{"invalid JSON"},
	}, {
		name:     "bad item in a JSON list",
		file:     "list.json",
		data:     "{\"kind\": \"List\", \"items\": [\n  {\"kind\": \"Node\", \"metadata\": {\"name\": \"a\"}},\n  {\"kind\": \"Node\", \"metadata\": {\"name\": \"b\", \"labels\": 5}}\n]}\n",
		wantObjs: []string{"Node a"},
		wantErrs: []DocumentError{{File: "list.json", Document: 1, Item: 1, Line: 3, Kind: "Node", Name: "b"}},
		wantMsgs: []string{"cannot unmarshal number"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs, errs := Parse(tc.file, []byte(tc.data))
			if diff := cmp.Diff(tc.wantObjs, summary(objs)); diff != "" {
				t.Errorf("objects kept (-want +got):\n%s", diff)
			}
			var got []DocumentError
			for i, err := range errs {
				var de *DocumentError
				if !errors.As(err, &de) {
					t.Fatalf("error %d is %T, want *DocumentError: %v", i, err, err)
				}
				got = append(got, *de)
				if i < len(tc.wantMsgs) && !strings.Contains(err.Error(), tc.wantMsgs[i]) {
					t.Errorf("error %d = %q, want it to contain %q", i, err, tc.wantMsgs[i])
				}
			}
			if diff := cmp.Diff(tc.wantErrs, got, cmpopts.IgnoreFields(DocumentError{}, "Err")); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLoadDirectory(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a-services.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: demo}\n")
	write("b-nodes.json", `{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}`)
	write("c-slices.yml", "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1, namespace: demo}\naddressType: IPv4\n")
	write("d-again.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: demo}\n")
	write(".hidden.yaml", "apiVersion: v1\nkind: Node\nmetadata: {name: hidden}\n")
	write("notes.txt", "apiVersion: v1\nkind: Node\nmetadata: {name: txt}\n")
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}

	objs, errs := Load(dir)
	want := []string{"Service demo/web", "EndpointSlice demo/web-1", "Node node-a"}
	if diff := cmp.Diff(want, summary(objs)); diff != "" {
		t.Errorf("objects (-want +got):\n%s", diff)
	}
	// A directory with a snapshot file's name is a fault of that name (it
	// may be where a file was), not a subdirectory to read.
	var fe *FileError
	if len(errs) != 2 || !strings.Contains(errs[0].Error(), "d-again.yaml") ||
		!strings.Contains(errs[0].Error(), "duplicate Service demo/web, already read at "+filepath.Join(dir, "a-services.yaml")) ||
		!errors.As(errs[1], &fe) || fe.Reason != ReasonNotRegular || fe.File != filepath.Join(dir, "sub.yaml") {
		t.Errorf("errors = %v, want one duplicate in d-again.yaml and sub.yaml not a regular file", errs)
	}

	// One file alone.
	objs, errs = Load(filepath.Join(dir, "b-nodes.json"))
	if len(errs) != 0 || !cmp.Equal(summary(objs), []string{"Node node-a"}) {
		t.Errorf("Load(file) = %v, %v", summary(objs), errs)
	}

	// A path that does not exist.
	objs, errs = Load(filepath.Join(dir, "nope.yaml"))
	if len(errs) != 1 || !errors.Is(errs[0], os.ErrNotExist) || len(summary(objs)) != 0 {
		t.Errorf("Load(missing) = %v, %v; want one not-exist error", summary(objs), errs)
	}
}

func TestSplitYAML(t *testing.T) {
	data := "a: 1\n---\nb: 2\n--- # c\n\nc: 3\n...\n--- |\n  text\n"
	var got []string
	for _, c := range splitYAML([]byte(data)) {
		got = append(got, strings.TrimSpace(string(c.text))+"@"+string(rune('0'+c.line)))
	}
	want := []string{"a: 1@1", "b: 2@2", "# c\n\nc: 3@4", "@8", "|\n  text@8"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("chunks (-want +got):\n%s", diff)
	}
}

// TestUndecodableCounted: an object of a file that cannot be used at all
// is counted in kproxy_invalid_objects_total{reason="undecodable"}, under
// its kind when it is one the source reads, else "other".
func TestUndecodableCounted(t *testing.T) {
	svc := metrics.InvalidObjectsTotal.WithLabelValues("Service", ReasonUndecodable)
	other := metrics.InvalidObjectsTotal.WithLabelValues("other", ReasonUndecodable)
	s0, o0 := promtestutil.ToFloat64(svc), promtestutil.ToFloat64(other)
	_, errs := Parse("f.yaml", []byte(`{"kind":"List","items":[{"kind":"Service","metadata":{"name":"a"},"spec":{"ports":"x"}},{"hello":"world"},{"kind":"Service","metadata":{"name":"b"},"spec":{"clusterIP":"198.19.0.1"}}]}`))
	if len(errs) != 2 {
		t.Fatalf("errors: %v", errs)
	}
	if d := promtestutil.ToFloat64(svc) - s0; d != 1 {
		t.Errorf("Service undecodable counted %v times, want 1", d)
	}
	if d := promtestutil.ToFloat64(other) - o0; d != 1 {
		t.Errorf("other undecodable counted %v times, want 1", d)
	}
}

// TestFieldNamesAreCaseSensitive: "speC" is not spec, as for the API
// server; encoding/json alone would match it (found by FuzzLoad).
func TestFieldNamesAreCaseSensitive(t *testing.T) {
	p := filepath.Join(t.TempDir(), "s.yaml")
	doc := "kind: Service\napiVersion: v1\nmetadata: {name: a, namespace: ns}\nspeC:\n  ClusterIP: 198.19.0.1\n  ports: [{port: 80}]\n"
	if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	objs, errs := Load(p)
	if len(errs) != 0 || len(objs.Services) != 1 {
		t.Fatalf("errs %v, %d services", errs, len(objs.Services))
	}
	if s := objs.Services[0].Spec; s.ClusterIP != "" || len(s.Ports) != 0 {
		t.Errorf("misspelt fields were read as spec: %+v", s)
	}
}
