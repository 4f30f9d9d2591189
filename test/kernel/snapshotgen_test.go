package kernel

// Snapshot edits for load and address changes: generated ClusterIP
// services gen-0, gen-1, … (198.19.10.1 onwards, 200 per /24, up to
// 198.19.54.200) with web-clusterip's endpoints, and a Node's InternalIP
// addresses rewritten.

import (
	"fmt"
	"testing"
)

// addServices adds n ClusterIP services (gen-0 … on 198.19.10.1 onwards,
// 200 per /24) with web-clusterip's endpoints.
func addServices(t *testing.T, s *snapshot, n int) {
	t.Helper()
	addServicesFrom(t, s, 0, n)
}

// genVIP is the ClusterIP of generated service gen-i.
func genVIP(i int) string { return fmt.Sprintf("198.19.%d.%d", 10+i/200, 1+i%200) }

// addServicesFrom adds gen-from … gen-(from+n-1) (at most 9,000 in all,
// up to 198.19.54.200).
func addServicesFrom(t *testing.T, s *snapshot, from, n int) {
	t.Helper()
	var svc, slice map[string]any
	for _, o := range s.Items {
		k, name := kindName(o)
		if k == "Service" && name == "web-clusterip" {
			svc = o
		}
		if k == "EndpointSlice" && name == "web-clusterip-x7k2p" {
			slice = o
		}
	}
	if svc == nil || slice == nil {
		t.Fatal("web-clusterip not in the snapshot")
	}
	for i := from; i < from+n; i++ {
		name := fmt.Sprintf("gen-%d", i)
		vip := genVIP(i)
		c := deepCopy(t, svc)
		md := c["metadata"].(map[string]any)
		md["name"], md["uid"] = name, fmt.Sprintf("6b1f0c2e-7000-4a5b-9c8d-%012d", i)
		spec := c["spec"].(map[string]any)
		spec["clusterIP"], spec["clusterIPs"] = vip, []any{vip}
		e := deepCopy(t, slice)
		emd := e["metadata"].(map[string]any)
		emd["name"], emd["uid"] = name+"-x", fmt.Sprintf("6b1f0c2e-7001-4a5b-9c8d-%012d", i)
		emd["labels"].(map[string]any)["kubernetes.io/service-name"] = name
		delete(emd, "ownerReferences")
		s.Items = append(s.Items, c, e)
	}
}

func deepCopy(t *testing.T, o map[string]any) map[string]any {
	t.Helper()
	var c map[string]any
	convert(t, o, &c)
	return c
}

// editNode rewrites the InternalIP addresses of a Node in the snapshot.
func (s *snapshot) editNode(t *testing.T, name string, fn func([]string) []string) {
	t.Helper()
	for _, o := range s.Items {
		if k, n := kindName(o); k != "Node" || n != name {
			continue
		}
		st := o["status"].(map[string]any)
		var internal []string
		var rest []any
		for _, a := range st["addresses"].([]any) {
			am := a.(map[string]any)
			if am["type"] == "InternalIP" {
				internal = append(internal, am["address"].(string))
			} else {
				rest = append(rest, a)
			}
		}
		var addrs []any
		for _, a := range fn(internal) {
			addrs = append(addrs, map[string]any{"type": "InternalIP", "address": a})
		}
		st["addresses"] = append(addrs, rest...)
		bumpVersion(o)
		return
	}
	t.Fatalf("no Node %q in the snapshot", name)
}
