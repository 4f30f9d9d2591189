package kernel

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/internal/example"
)

// snapshot is a kubectl List of Services, EndpointSlices and Nodes, kept as
// generic objects so that tests can also write what the API types cannot
// (a malformed Service).
type snapshot struct {
	Items []map[string]any `json:"items"`
}

// exampleSnapshot returns a fresh copy of kproxy's built-in example.
func exampleSnapshot(t *testing.T) *snapshot {
	t.Helper()
	var s snapshot
	if err := yaml.Unmarshal(example.YAML, &s); err != nil {
		t.Fatalf("parsing the example: %v", err)
	}
	return &s
}

func (s *snapshot) clone(t *testing.T) *snapshot {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var c snapshot
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	return &c
}

// yaml renders the snapshot as kubectl would.
func (s *snapshot) yaml(t *testing.T) []byte {
	t.Helper()
	b, err := yaml.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "List", "metadata": map[string]any{"resourceVersion": ""}, "items": s.Items,
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// writeTo replaces path with the snapshot atomically: written to a hidden
// file in the same directory (which the file source ignores), then renamed
// over path, as `kubectl get -o yaml > tmp && mv tmp file` would.
func (s *snapshot) writeTo(t *testing.T, path string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, s.yaml(t), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func kindName(o map[string]any) (string, string) {
	kind, _ := o["kind"].(string)
	md, _ := o["metadata"].(map[string]any)
	name, _ := md["name"].(string)
	return kind, name
}

func convert(t *testing.T, from, to any) {
	t.Helper()
	b, err := json.Marshal(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, to); err != nil {
		t.Fatal(err)
	}
}

// bumpVersion gives an edited object a new resourceVersion, as the API
// server would.
func bumpVersion(o map[string]any) {
	md, _ := o["metadata"].(map[string]any)
	if md == nil {
		return
	}
	rv, _ := strconv.Atoi(fmt.Sprint(md["resourceVersion"]))
	md["resourceVersion"] = strconv.Itoa(rv + 10000)
}

// endpointSlices returns the typed EndpointSlices.
func (s *snapshot) endpointSlices(t *testing.T) []discovery.EndpointSlice {
	t.Helper()
	var out []discovery.EndpointSlice
	for _, o := range s.Items {
		if k, _ := kindName(o); k == "EndpointSlice" {
			var es discovery.EndpointSlice
			convert(t, o, &es)
			out = append(out, es)
		}
	}
	return out
}

// editService changes the named Service.
func (s *snapshot) editService(t *testing.T, name string, fn func(*v1.Service)) {
	t.Helper()
	for i, o := range s.Items {
		if k, n := kindName(o); k == "Service" && n == name {
			var svc v1.Service
			convert(t, o, &svc)
			fn(&svc)
			var m map[string]any
			convert(t, &svc, &m)
			bumpVersion(m)
			s.Items[i] = m
			return
		}
	}
	t.Fatalf("no Service %q in the snapshot", name)
}

// editSlices changes every EndpointSlice of the named Service.
func (s *snapshot) editSlices(t *testing.T, service string, fn func(*discovery.EndpointSlice)) {
	t.Helper()
	found := false
	for i, o := range s.Items {
		if k, _ := kindName(o); k != "EndpointSlice" {
			continue
		}
		var es discovery.EndpointSlice
		convert(t, o, &es)
		if es.Labels[discovery.LabelServiceName] != service {
			continue
		}
		found = true
		fn(&es)
		var m map[string]any
		convert(t, &es, &m)
		bumpVersion(m)
		s.Items[i] = m
	}
	if !found {
		t.Fatalf("no EndpointSlice of Service %q in the snapshot", service)
	}
}

// removeEndpoint deletes the endpoint of the named pod from every slice of
// the Service, as the EndpointSlice controller does when the pod goes away.
func (s *snapshot) removeEndpoint(t *testing.T, service, pod string) {
	t.Helper()
	removed := false
	s.editSlices(t, service, func(es *discovery.EndpointSlice) {
		es.Endpoints = slices.DeleteFunc(es.Endpoints, func(e discovery.Endpoint) bool {
			if e.TargetRef != nil && e.TargetRef.Name == pod {
				removed = true
				return true
			}
			return false
		})
	})
	if !removed {
		t.Fatalf("Service %s has no endpoint of pod %s", service, pod)
	}
}

// add appends an object given as YAML (it may be one the API would refuse).
func (s *snapshot) add(t *testing.T, objYAML string) {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal([]byte(objYAML), &m); err != nil {
		t.Fatalf("test object: %v", err)
	}
	s.Items = append(s.Items, m)
}

// addList appends the items of a List given as YAML.
func (s *snapshot) addList(t *testing.T, listYAML string) {
	t.Helper()
	var l snapshot
	if err := yaml.Unmarshal([]byte(listYAML), &l); err != nil {
		t.Fatalf("test objects: %v", err)
	}
	s.Items = append(s.Items, l.Items...)
}

// podInfo is a pod that endpoints of the snapshot point at.
type podInfo struct {
	name, node string
	ips        []netip.Addr
	// ports the pod serves: "tcp/8080", "udp/53" (SCTP ports are left out:
	// see TestSCTP).
	ports []string
}

// pods lists the pods behind the snapshot's endpoints, with every address
// and port any slice gives them, in a stable order.
func (s *snapshot) pods(t *testing.T) []podInfo {
	t.Helper()
	byName := map[string]*podInfo{}
	var order []string
	for _, es := range s.endpointSlices(t) {
		for _, e := range es.Endpoints {
			if e.TargetRef == nil || e.TargetRef.Kind != "Pod" || e.NodeName == nil {
				continue
			}
			p, ok := byName[e.TargetRef.Name]
			if !ok {
				p = &podInfo{name: e.TargetRef.Name, node: *e.NodeName}
				byName[p.name] = p
				order = append(order, p.name)
			}
			for _, a := range e.Addresses {
				ip, err := netip.ParseAddr(a)
				if err != nil {
					t.Fatalf("slice %s: endpoint address %q: %v", es.Name, a, err)
				}
				if !slices.Contains(p.ips, ip) {
					p.ips = append(p.ips, ip)
				}
			}
			for _, port := range es.Ports {
				if port.Port == nil || port.Protocol == nil {
					continue
				}
				var proto string
				switch *port.Protocol {
				case v1.ProtocolTCP:
					proto = "tcp"
				case v1.ProtocolUDP:
					proto = "udp"
				default:
					continue
				}
				pp := fmt.Sprintf("%s/%d", proto, *port.Port)
				if !slices.Contains(p.ports, pp) {
					p.ports = append(p.ports, pp)
				}
			}
		}
	}
	out := make([]podInfo, 0, len(order))
	for _, n := range order {
		out = append(out, *byName[n])
	}
	return out
}
