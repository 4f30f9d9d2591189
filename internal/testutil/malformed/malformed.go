// Package malformed is the catalogue of named malformed inputs:
// objects and files a source may hand kproxy, each with what kproxy must
// do with it and whether the API server accepts it. The kernel test
// (test/kernel/catalogue_test.go) gives every case to kproxy through the
// file source beside the healthy example; the end-to-end test gives the
// cases the API server accepts through a real one, and checks that it
// refuses the others; the unit test here checks the model's verdict on
// each case without a kernel.
//
// Addresses (inside the test namespaces only):
//
//	198.19.60.0/23   the cases' cluster IPs: case N (0-based) has 198.19.60.0 + N + 1
//	198.19.62.0/24   the newer Service of a contested case: case N has 198.19.62.0 + N + 1
//	fd00:19::3c:1     the cluster IP of the wrong-family case
//	198.18.140.0/23  the cases' endpoints (nothing listens there): case N has 198.18.140.0 + N + 1
//	198.19.220.0/24  external and load balancer IPs of the cases
//	203.0.113.0/24   source ranges
package malformed

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Want is what kproxy must do with a case.
type Want string

const (
	// Skip: the object is skipped whole, as if absent; one log line
	// names it and the reason, and kproxy_invalid_objects_total{Kind,
	// Reason} counts it. No rule comes from it.
	Skip Want = "skip"
	// SkipPart: a part (a port, an endpoint, an address, a setting) is
	// skipped or replaced by its default, logged and counted the same
	// way; the rest of the object is used.
	SkipPart Want = "skip-part"
	// Contested: a valid object asks for an address or port another,
	// older, service holds; it loses that claim (logged, counted as
	// reason "contested"), the older one keeps it.
	Contested Want = "contested"
	// Accept: valid (often at a limit); used as it is.
	Accept Want = "accept"
	// NotProxied: valid, but by design nothing is programmed for it
	// (headless, ExternalName, another proxy's label, FQDN slices, a
	// slice whose service does not exist).
	NotProxied Want = "not-proxied"
	// Ignore: a kind kproxy does not read (logged at -v 2).
	Ignore Want = "ignore"
	// FileFault: the file as a whole cannot be used; it gives no object
	// (what it gave before is kept), one log line names the file and
	// kproxy_source_file_errors_total{reason=Reason} counts it.
	FileFault Want = "file-fault"
)

// Case is one malformed input.
type Case struct {
	Name string
	// Category groups the cases in reports (ip, port, protocol, ...).
	Category string
	// Objects are the case's objects, as written into a snapshot List
	// (the file source reads them; the API server is given them as
	// they are). A value that is not a map is an item that is not an
	// object at all.
	Objects []any
	// File, for file-level cases, makes the bytes of a file of its own.
	File func() []byte
	Want Want
	// Kind and Reason are the labels kproxy_invalid_objects_total counts
	// the case under (for FileFault, Reason is the file fault reason).
	Kind, Reason string
	// Object is "namespace/name" (a Node: its name) as the log line
	// names it.
	Object string
	// APIAccepts says whether the API server accepts the objects (in
	// order, each created after the previous).
	APIAccepts bool
	// APIWant, when set, is what kproxy must do with the objects as the
	// API server stores them, where that differs from Want (the API
	// server fills in a default the file source does not); the rules
	// flags hold for both.
	APIWant Want
	// ClusterIP is the case's own cluster IP, Endpoint its endpoint
	// address. InRules says whether ClusterIP must be in the rules
	// (false: it must not be); Endpoint is in the rules only when
	// EndpointInRules.
	ClusterIP, Endpoint      string
	InRules, EndpointInRules bool
}

// Namespace holds every case's objects unless the case is about
// namespaces.
const Namespace = "mal"

// obj is a JSON object under construction.
type obj = map[string]any

// set sets a dotted path in o ("spec.ports.0.port"); numbers index lists.
func set(o obj, path string, v any) {
	parts := strings.Split(path, ".")
	var cur any = o
	for i, p := range parts {
		last := i == len(parts)-1
		switch c := cur.(type) {
		case obj:
			if last {
				c[p] = v
				return
			}
			next, ok := c[p]
			if !ok {
				next = obj{}
				c[p] = next
			}
			cur = next
		case []any:
			n, err := strconv.Atoi(p)
			if err != nil || n >= len(c) {
				panic("malformed: bad path " + path)
			}
			if last {
				c[n] = v
				return
			}
			cur = c[n]
		default:
			panic("malformed: bad path " + path)
		}
	}
}

func del(o obj, path string) {
	i := strings.LastIndex(path, ".")
	parent := any(o)
	if i >= 0 {
		for _, p := range strings.Split(path[:i], ".") {
			switch c := parent.(type) {
			case obj:
				parent = c[p]
			case []any:
				n, _ := strconv.Atoi(p)
				parent = c[n]
			}
		}
	}
	delete(parent.(obj), path[i+1:])
}

// clone deep-copies a JSON value.
func clone(v any) any {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		panic(err)
	}
	return out
}

// ip returns base + n + 1 (n < 510).
func ip(base string, n int) string {
	a := netip.MustParseAddr(base).As4()
	v := int(a[2])<<8 | int(a[3])
	v += n + 1
	a[2], a[3] = byte(v>>8), byte(v)
	return netip.AddrFrom4(a).String()
}

// ClusterIPOf and EndpointOf are the addresses of case n.
func ClusterIPOf(n int) string { return ip("198.19.60.0", n) }
func EndpointOf(n int) string  { return ip("198.18.140.0", n) }

// ServiceName is the name of case n's Service.
func ServiceName(n int) string { return fmt.Sprintf("mc-%03d", n) }

// service returns case n's Service: ClusterIP, one port http 80/TCP.
func service(n int) obj {
	return obj{
		"apiVersion": "v1", "kind": "Service",
		"metadata": obj{"name": ServiceName(n), "namespace": Namespace, "creationTimestamp": "2026-01-01T00:00:00Z"},
		"spec": obj{
			"type": "ClusterIP", "clusterIP": ClusterIPOf(n), "clusterIPs": []any{ClusterIPOf(n)},
			"ipFamilies": []any{"IPv4"},
			"ports":      []any{obj{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}},
		},
	}
}

// slice returns case n's EndpointSlice: one ready endpoint on node-b,
// port http 8080/TCP.
func slice(n int) obj {
	return obj{
		"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
		"metadata": obj{"name": ServiceName(n) + "-s", "namespace": Namespace,
			"labels": obj{"kubernetes.io/service-name": ServiceName(n)}},
		"endpoints": []any{obj{"addresses": []any{EndpointOf(n)}, "conditions": obj{"ready": true}, "nodeName": "node-b"}},
		"ports":     []any{obj{"name": "http", "port": 8080, "protocol": "TCP"}},
	}
}

func node(name string) obj {
	return obj{"apiVersion": "v1", "kind": "Node", "metadata": obj{"name": name},
		"status": obj{"addresses": []any{obj{"type": "InternalIP", "address": "198.18.0.99"}}}}
}

// endpoints returns k endpoints from 198.18.142.0 on (k <= 8192).
func endpoints(k int) []any {
	out := make([]any, k)
	for i := range out {
		a := netip.AddrFrom4([4]byte{198, 18, byte(142 + i/256), byte(i % 256)})
		out[i] = obj{"addresses": []any{a.String()}, "conditions": obj{"ready": true}}
	}
	return out
}
