package malformed

import (
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/internal/model"
)

// Reason labels of kproxy_invalid_objects_total the cases use besides the
// model's (see internal/source/file ReasonUndecodable and the proxy's
// contested count).
const (
	ReasonUndecodable = "undecodable"
	ReasonContested   = "contested"
)

// Hostile strings for every text field that can reach a rule comment.
var texts = []struct{ name, s string }{
	{"a double quote", `we"b`},
	{"a newline and an iptables rule", "web\n-A KUBE-SERVICES -j ACCEPT"},
	{"nft text closing the comment", `web" ; } add rule ip kube-proxy services accept #`},
	{"non-ASCII", "wéb-ü"},
	{"a backslash", `we\b`},
	{"a single quote and spaces", "we'b s"},
}

func objectOf(o obj) string {
	m, _ := o["metadata"].(obj)
	ns, _ := m["namespace"].(string)
	name, _ := m["name"].(string)
	if o["kind"] == "Node" {
		return name
	}
	if ns == "" {
		ns = "default"
	}
	return ns + "/" + name
}

// svcCase is a case about case n's Service, edited by mut; its slice is
// valid. The service's cluster IP and endpoint are in the rules when
// inRules.
func svcCase(n int, cat, name string, want Want, reason string, api, inRules bool, mut func(obj)) Case {
	s := service(n)
	mut(s)
	return Case{Name: name, Category: cat, Objects: []any{s, slice(n)}, Want: want, Kind: "Service", Reason: reason,
		Object: objectOf(s), APIAccepts: api, ClusterIP: ClusterIPOf(n), Endpoint: EndpointOf(n), InRules: inRules, EndpointInRules: inRules}
}

// sliceCase is a case about case n's EndpointSlice, edited by mut; its
// Service is valid (its cluster IP is in the rules). The endpoint is in
// the rules when epInRules.
func sliceCase(n int, cat, name string, want Want, reason string, api, epInRules bool, mut func(obj)) Case {
	sl := slice(n)
	mut(sl)
	return Case{Name: name, Category: cat, Objects: []any{service(n), sl}, Want: want, Kind: "EndpointSlice", Reason: reason,
		Object: objectOf(sl), APIAccepts: api, ClusterIP: ClusterIPOf(n), Endpoint: EndpointOf(n), InRules: true, EndpointInRules: epInRules}
}

// nodeCase is a case about a Node (not the node kproxy runs on).
func nodeCase(n int, name string, want Want, reason string, api bool, mut func(obj)) Case {
	o := node("mal-node-" + strconv.Itoa(n))
	mut(o)
	return Case{Name: name, Category: "node", Objects: []any{o}, Want: want, Kind: "Node", Reason: reason, Object: objectOf(o),
		APIAccepts: api, ClusterIP: ClusterIPOf(n), Endpoint: EndpointOf(n)}
}

// itemCase is an item of the List that the file source cannot use.
func itemCase(n int, name, kind string, api bool, item any) Case {
	object := ""
	if o, ok := item.(obj); ok {
		if m, named := o["metadata"].(obj); named {
			if _, ok := m["name"].(string); ok {
				object = objectOf(o)
			}
		}
	}
	return Case{Name: name, Category: "not-kubernetes", Objects: []any{item}, Want: Skip, Kind: kind, Reason: ReasonUndecodable,
		Object: object, APIAccepts: api, ClusterIP: ClusterIPOf(n), Endpoint: EndpointOf(n)}
}

func port(field string, v any) func(obj) { return func(o obj) { set(o, "spec.ports.0."+field, v) } }

func nodePortType(o obj) { set(o, "spec.type", "NodePort") }

// Cases returns the catalogue's object-level cases, each case N (its index)
// using its own addresses (ClusterIPOf(N), EndpointOf(N)).
func Cases() []Case {
	var cs []Case
	n := func() int { return len(cs) }
	add := func(c Case) { cs = append(cs, c) }
	long := func(k int) string { return "a" + strings.Repeat("b", k-2) + "c" }

	// IP addresses.
	for _, v := range []struct{ name, ip string }{
		{"cluster IP 198.19.60.300 (octet over 255)", "198.19.60.300"},
		{"cluster IP not an IP", "not-an-ip"},
		{"cluster IP with a zone", "198.19.60.9%eth0"},
		{"cluster IP a CIDR", "198.19.60.9/32"},
		{"cluster IP with a trailing dot", "198.19.60.9."},
		{"cluster IP IPv6 with two ::", "fd00::19::1"},
	} {
		add(svcCase(n(), "ip", v.name, Skip, model.ReasonInvalidPart, false, false, func(o obj) {
			set(o, "spec.clusterIP", v.ip)
			set(o, "spec.clusterIPs", []any{v.ip})
		}))
	}
	add(svcCase(n(), "ip", "cluster IPs: two IPv4 addresses", Skip, model.ReasonInvalidPart, false, false, func(o obj) {
		set(o, "spec.clusterIPs", []any{ClusterIPOf(len(cs)), "198.19.61.250"})
		set(o, "spec.ipFamilies", []any{"IPv4", "IPv6"})
	}))
	add(svcCase(n(), "ip", "cluster IPs: the second not an IP", Skip, model.ReasonInvalidPart, false, false, func(o obj) {
		set(o, "spec.clusterIPs", []any{ClusterIPOf(len(cs)), "bogus"})
		set(o, "spec.ipFamilies", []any{"IPv4", "IPv6"})
	}))
	{
		k := n()
		add(svcCase(k, "ip", "cluster IP with leading zeros (read as decimal, as upstream)", Accept, "", false, true, func(o obj) {
			a := strings.Split(ClusterIPOf(k), ".")
			z := "0" + a[0] + ".0" + a[1] + ".0" + a[2] + ".0" + a[3]
			set(o, "spec.clusterIP", z)
			set(o, "spec.clusterIPs", []any{z})
		}))
	}
	add(svcCase(n(), "ip", "cluster IP of the wrong family for ipFamilies", Accept, "", false, false, func(o obj) {
		set(o, "spec.clusterIP", "fd00:19::3c:1")
		set(o, "spec.clusterIPs", []any{"fd00:19::3c:1"})
	}))
	for _, v := range []struct{ name, ip string }{
		{"external IP not an IP", "bogus"},
		{"external IP a CIDR", "198.19.220.1/24"},
		{"external IP with a zone", "fd00:19::dc:1%eth0"},
	} {
		add(svcCase(n(), "ip", v.name, SkipPart, model.ReasonInvalidPart, false, true, func(o obj) { set(o, "spec.externalIPs", []any{v.ip}) }))
	}
	add(svcCase(n(), "ip", "external IP blank", Accept, "", false, true, func(o obj) { set(o, "spec.externalIPs", []any{" "}) }))
	add(svcCase(n(), "ip", "load balancer ingress IP not an IP", SkipPart, model.ReasonInvalidPart, false, true, func(o obj) {
		set(o, "spec.type", "LoadBalancer")
		set(o, "status", obj{"loadBalancer": obj{"ingress": []any{obj{"ip": "198.19.220.300"}}}})
	}))

	// Ports.
	for _, v := range []struct {
		name string
		port int
	}{{"port 0", 0}, {"port 65536", 65536}, {"port -1", -1}, {"port 2^31-1", 1<<31 - 1}} {
		add(svcCase(n(), "port", v.name, SkipPart, model.ReasonInvalidPart, false, false, port("port", v.port)))
	}
	add(svcCase(n(), "port", "port 65535", Accept, "", true, true, port("port", 65535)))
	add(svcCase(n(), "port", "port 1", Accept, "", true, true, port("port", 1)))
	add(svcCase(n(), "port", "port a string", Skip, ReasonUndecodable, false, false, port("port", "eighty")))
	add(svcCase(n(), "port", "port a fraction", Skip, ReasonUndecodable, false, false, port("port", 80.5)))
	add(svcCase(n(), "port", "no ports at all", Skip, model.ReasonNoPorts, false, false, func(o obj) { delete(o["spec"].(obj), "ports") }))
	add(svcCase(n(), "port", "field names in the wrong case (speC): not spec, so no ports", Skip, model.ReasonNoPorts, false, false, func(o obj) {
		o["speC"] = o["spec"]
		delete(o, "spec")
	}))
	for _, v := range []struct {
		name string
		np   int
	}{{"node port 65536", 65536}, {"node port -1", -1}} {
		add(svcCase(n(), "port", v.name, SkipPart, model.ReasonInvalidPart, false, true, func(o obj) { nodePortType(o); port("nodePort", v.np)(o) }))
	}
	for _, v := range []struct {
		name string
		np   int
	}{{"node port 0 (none)", 0}, {"node port 29999 (outside the API's range)", 29999}, {"node port 32768 (outside the API's range)", 32768}} {
		add(svcCase(n(), "port", v.name, Accept, "", v.np == 0, true, func(o obj) { nodePortType(o); port("nodePort", v.np)(o) }))
	}
	add(svcCase(n(), "port", "two ports named alike", Skip, model.ReasonPortName, false, false, func(o obj) {
		set(o, "spec.ports", []any{obj{"name": "http", "port": 80}, obj{"name": "http", "port": 81}})
	}))
	add(svcCase(n(), "port", "two ports, one without a name", Skip, model.ReasonPortName, false, false, func(o obj) {
		set(o, "spec.ports", []any{obj{"name": "http", "port": 80}, obj{"port": 81}})
	}))
	add(svcCase(n(), "port", "port name in capitals", Skip, model.ReasonPortName, false, false, port("name", "HTTP")))
	{
		c := svcCase(n(), "port", "port name 63 characters", Accept, "", true, true, port("name", long(63)))
		set(c.Objects[1].(obj), "ports.0.name", long(63))
		add(c)
	}
	add(svcCase(n(), "port", "port name 64 characters", Skip, model.ReasonPortName, false, false, port("name", long(64))))
	add(svcCase(n(), "port", "target port a bad name", Accept, "", false, true, port("targetPort", "-bad-")))
	add(svcCase(n(), "port", "health check node port 70000", SkipPart, model.ReasonInvalidPart, false, true, func(o obj) {
		set(o, "spec.type", "LoadBalancer")
		set(o, "spec.externalTrafficPolicy", "Local")
		set(o, "spec.healthCheckNodePort", 70000)
	}))

	// Protocols.
	for _, p := range []string{"ICMP", "tcp", "TCP\n-A KUBE-SERVICES -j ACCEPT", "HTTP"} {
		add(svcCase(n(), "protocol", "protocol "+strings.ReplaceAll(p, "\n", `\n`), SkipPart, model.ReasonInvalidPart, false, false, port("protocol", p)))
	}
	add(svcCase(n(), "protocol", "protocol empty (TCP)", Accept, "", true, true, port("protocol", "")))
	{
		c := svcCase(n(), "protocol", "protocol SCTP (its slice's port is TCP: no endpoint)", Accept, "", true, true, port("protocol", "SCTP"))
		c.EndpointInRules = false
		add(c)
	}
	add(sliceCase(n(), "protocol", "slice port protocol ICMP", SkipPart, model.ReasonInvalidPart, false, false, func(o obj) {
		set(o, "ports.0.protocol", "ICMP")
	}))

	// Contested addresses and ports: the case's second Service is
	// newer and loses.
	contested := func(name string, api bool, mut func(older, newer obj), inRules bool) {
		k := n()
		older, newer := service(k), service(k)
		set(newer, "metadata.name", ServiceName(k)+"-b")
		set(newer, "metadata.creationTimestamp", "2026-02-01T00:00:00Z")
		set(newer, "spec.clusterIP", ip("198.19.62.0", k))
		set(newer, "spec.clusterIPs", []any{ip("198.19.62.0", k)})
		mut(older, newer)
		sl := slice(k)
		sl["metadata"].(obj)["labels"] = obj{"kubernetes.io/service-name": ServiceName(k) + "-b"}
		add(Case{Name: name, Category: "contested", Objects: []any{older, newer, sl}, Want: Contested, Kind: "Service", Reason: ReasonContested,
			Object: Namespace + "/" + ServiceName(k) + "-b", APIAccepts: api, ClusterIP: ClusterIPOf(k), Endpoint: EndpointOf(k),
			InRules: true, EndpointInRules: inRules})
	}
	contested("two services with one cluster IP", false, func(_, newer obj) {
		set(newer, "spec.clusterIP", ClusterIPOf(len(cs)))
		set(newer, "spec.clusterIPs", []any{ClusterIPOf(len(cs))})
	}, false)
	contested("a node port claimed by two services", false, func(older, newer obj) {
		nodePortType(older)
		port("nodePort", 30950)(older)
		nodePortType(newer)
		port("nodePort", 30950)(newer)
	}, true)
	contested("an external IP claimed by two services", true, func(older, newer obj) {
		set(older, "spec.externalIPs", []any{"198.19.220.5"})
		set(newer, "spec.externalIPs", []any{"198.19.220.5"})
	}, true)
	contested("an external IP that is another service's cluster IP", true, func(older, newer obj) {
		set(newer, "spec.externalIPs", []any{ClusterIPOf(len(cs))})
	}, true)

	// EndpointSlices.
	add(sliceCase(n(), "slice", "slice with 1001 endpoints", Skip, model.ReasonTooMany, false, false, func(o obj) {
		o["endpoints"] = append(endpoints(1000), o["endpoints"].([]any)...)
	}))
	add(sliceCase(n(), "slice", "slice with 5000 endpoints", Skip, model.ReasonTooMany, false, false, func(o obj) {
		o["endpoints"] = append(endpoints(4999), o["endpoints"].([]any)...)
	}))
	add(sliceCase(n(), "slice", "slice with 1000 endpoints (the limit)", Accept, "", true, true, func(o obj) {
		o["endpoints"] = append(endpoints(999), o["endpoints"].([]any)...)
	}))
	add(sliceCase(n(), "slice", "slice with no endpoints and no ports", Accept, "", true, false, func(o obj) {
		o["endpoints"], o["ports"] = []any{}, []any{}
	}))
	{
		k := n()
		sl := slice(k)
		add(Case{Name: "the same slice twice", Category: "slice", Objects: []any{service(k), sl, clone(sl)}, Want: Skip, Kind: "EndpointSlice",
			Reason: ReasonUndecodable, Object: Namespace + "/" + ServiceName(k) + "-s", APIAccepts: false, ClusterIP: ClusterIPOf(k),
			Endpoint: EndpointOf(k), InRules: true, EndpointInRules: true})
	}
	{
		k := n()
		sl2 := slice(k)
		set(sl2, "metadata.name", ServiceName(k)+"-t")
		add(Case{Name: "two slices with the same endpoint", Category: "slice", Objects: []any{service(k), slice(k), sl2}, Want: Accept,
			Kind: "EndpointSlice", Object: Namespace + "/" + ServiceName(k) + "-t", APIAccepts: true, ClusterIP: ClusterIPOf(k),
			Endpoint: EndpointOf(k), InRules: true, EndpointInRules: true})
	}
	{
		k := n()
		add(Case{Name: "slice for a missing service", Category: "slice", Objects: []any{slice(k)}, Want: NotProxied, Kind: "EndpointSlice",
			Object: Namespace + "/" + ServiceName(k) + "-s", APIAccepts: true, ClusterIP: ClusterIPOf(k), Endpoint: EndpointOf(k)})
	}
	add(sliceCase(n(), "slice", "slice without the service-name label", Skip, model.ReasonServiceNameLabel, true, false, func(o obj) {
		del(o, "metadata.labels")
	}))
	add(sliceCase(n(), "slice", "slice whose service-name label is not a label value", Skip, model.ReasonServiceNameLabel, false, false, func(o obj) {
		o["metadata"].(obj)["labels"] = obj{"kubernetes.io/service-name": "a b"}
	}))
	for _, at := range []struct{ name, v string }{{"IPv5", "IPv5"}, {"empty", ""}, {"ipv4 (lower case)", "ipv4"}} {
		add(sliceCase(n(), "slice", "slice address type "+at.name, Skip, model.ReasonAddressType, false, false,
			func(o obj) { o["addressType"] = at.v }))
	}
	add(sliceCase(n(), "slice", "slice address type FQDN", NotProxied, "", true, false, func(o obj) {
		o["addressType"] = "FQDN"
		set(o, "endpoints.0.addresses", []any{"web.example"})
	}))
	for _, v := range []struct{ name, addr string }{
		{"IPv4 slice with an IPv6 endpoint", "fd00:18:8c::1"},
		{"endpoint address not an IP", "bogus"},
		{"endpoint address a CIDR", "198.18.140.200/32"},
		{"endpoint address with a zone", "198.18.140.201%eth0"},
	} {
		add(sliceCase(n(), "slice", v.name, SkipPart, model.ReasonInvalidPart, false, false, func(o obj) {
			set(o, "endpoints.0.addresses", []any{v.addr})
		}))
	}
	add(sliceCase(n(), "slice", "IPv6 slice with an IPv4 endpoint", SkipPart, model.ReasonInvalidPart, false, false, func(o obj) {
		o["addressType"] = "IPv6"
	}))
	add(sliceCase(n(), "slice", "endpoint without addresses", SkipPart, model.ReasonInvalidPart, false, false, func(o obj) {
		set(o, "endpoints.0.addresses", []any{})
	}))
	add(sliceCase(n(), "slice", "endpoint with two addresses (the first is used)", Accept, "", true, true, func(o obj) {
		set(o, "endpoints.0.addresses", []any{EndpointOf(len(cs)), "198.18.141.250"})
	}))
	for _, v := range []struct {
		name string
		p    any
	}{{"slice port 0", 0}, {"slice port 65536", 65536}} {
		// The API server does not check a slice's port numbers.
		add(sliceCase(n(), "slice", v.name, SkipPart, model.ReasonInvalidPart, true, false, func(o obj) { set(o, "ports.0.port", v.p) }))
	}
	add(sliceCase(n(), "slice", "slice port name in capitals", Skip, model.ReasonPortName, false, false, func(o obj) { set(o, "ports.0.name", "HTTP") }))
	add(sliceCase(n(), "slice", "slice ports named alike", Skip, model.ReasonPortName, false, false, func(o obj) {
		o["ports"] = []any{obj{"name": "http", "port": 8080}, obj{"name": "http", "port": 8081}}
	}))
	{
		// The file source reads no name; the API server stores the
		// name "", which is valid and matches no named service port.
		c := sliceCase(n(), "slice", "slice port without a name (the API defaults it to \"\")", SkipPart, model.ReasonInvalidPart, true, false, func(o obj) {
			del(o, "ports.0.name")
		})
		c.APIWant = Accept
		add(c)
	}
	add(sliceCase(n(), "slice", "endpoint node name with a quote and a newline", Accept, "", false, true, func(o obj) {
		set(o, "endpoints.0.nodeName", "node\"b\n-A X")
	}))
	add(sliceCase(n(), "slice", "endpoint zone and hints with quotes", Accept, "", false, true, func(o obj) {
		set(o, "endpoints.0.zone", `zone"b`)
		set(o, "endpoints.0.hints", obj{"forZones": []any{obj{"name": `zone"b`}}})
	}))
	add(sliceCase(n(), "slice", "endpoint conditions all false", Accept, "", true, false, func(o obj) {
		set(o, "endpoints.0.conditions", obj{"ready": false, "serving": false, "terminating": false})
	}))

	// Source ranges.
	for _, r := range []string{"bogus", "203.0.113.0/33", "2001:db8::/129", "::ffff:203.0.113.0/120", "203.0.113.0/24,198.18.0.0/16"} {
		add(svcCase(n(), "source-range", "source range "+r, SkipPart, model.ReasonInvalidPart, false, true, func(o obj) {
			set(o, "spec.type", "LoadBalancer")
			set(o, "spec.loadBalancerSourceRanges", []any{r})
		}))
	}
	add(svcCase(n(), "source-range", "source range blank", Accept, "", false, true, func(o obj) {
		set(o, "spec.type", "LoadBalancer")
		set(o, "spec.loadBalancerSourceRanges", []any{" "})
	}))

	// Names and labels at and over the limits.
	{
		c := svcCase(n(), "names", "service name 63 characters", Accept, "", true, true, func(o obj) { set(o, "metadata.name", long(63)) })
		c.Objects[1].(obj)["metadata"].(obj)["labels"] = obj{"kubernetes.io/service-name": long(63)}
		add(c)
	}
	add(svcCase(n(), "names", "service name 64 characters", Skip, model.ReasonName, false, false, func(o obj) { set(o, "metadata.name", long(64)) }))
	add(svcCase(n(), "names", "service name 1000 characters", Skip, model.ReasonName, false, false, func(o obj) { set(o, "metadata.name", long(1000)) }))
	add(svcCase(n(), "names", "service name in capitals", Skip, model.ReasonName, false, false, func(o obj) { set(o, "metadata.name", "Web") }))
	// Accepted since RelaxedServiceNameValidation (Service names are
	// DNS-1123 labels, no longer DNS-1035).
	{
		c := svcCase(n(), "names", "service name starting with a digit", Accept, "", true, true, func(o obj) { set(o, "metadata.name", "1web") })
		c.Objects[1].(obj)["metadata"].(obj)["labels"] = obj{"kubernetes.io/service-name": "1web"}
		add(c)
	}
	add(svcCase(n(), "names", "service name with a dot", Skip, model.ReasonName, false, false, func(o obj) { set(o, "metadata.name", "web.x") }))
	add(svcCase(n(), "names", "service without a name", Skip, ReasonUndecodable, false, false, func(o obj) { del(o, "metadata.name") }))
	add(svcCase(n(), "names", "namespace 64 characters", Skip, model.ReasonNamespace, false, false, func(o obj) { set(o, "metadata.namespace", long(64)) }))
	add(svcCase(n(), "names", "namespace in capitals", Skip, model.ReasonNamespace, false, false, func(o obj) { set(o, "metadata.namespace", "Mal") }))
	add(svcCase(n(), "names", "service-proxy-name label 63 characters (another proxy's)", NotProxied, "", true, false, func(o obj) {
		set(o, "metadata.labels", obj{"service.kubernetes.io/service-proxy-name": long(63)})
	}))
	add(svcCase(n(), "names", "service-proxy-name label 64 characters", Skip, model.ReasonLabel, false, false, func(o obj) {
		set(o, "metadata.labels", obj{"service.kubernetes.io/service-proxy-name": long(64)})
	}))
	add(svcCase(n(), "names", "headless label with a newline", Skip, model.ReasonLabel, false, false, func(o obj) {
		set(o, "metadata.labels", obj{"service.kubernetes.io/headless": "a\nb"})
	}))
	add(sliceCase(n(), "names", "slice name 253 characters", Accept, "", true, true, func(o obj) {
		set(o, "metadata.name", strings.Repeat(long(63)+".", 3)+long(61))
	}))
	add(sliceCase(n(), "names", "slice name 254 characters", Skip, model.ReasonName, false, false, func(o obj) {
		set(o, "metadata.name", strings.Repeat(long(63)+".", 3)+long(62))
	}))
	add(sliceCase(n(), "names", "slice service-name label 64 characters", Skip, model.ReasonServiceNameLabel, false, false, func(o obj) {
		o["metadata"].(obj)["labels"] = obj{"kubernetes.io/service-name": long(64)}
	}))
	add(sliceCase(n(), "names", "slice without a name", Skip, ReasonUndecodable, false, false, func(o obj) { del(o, "metadata.name") }))

	// Text that could reach a rule comment, in every such field.
	for _, tx := range texts {
		add(svcCase(n(), "text", "service name with "+tx.name, Skip, model.ReasonName, false, false, func(o obj) { set(o, "metadata.name", tx.s) }))
		add(svcCase(n(), "text", "namespace with "+tx.name, Skip, model.ReasonNamespace, false, false, func(o obj) { set(o, "metadata.namespace", tx.s) }))
		add(svcCase(n(), "text", "port name with "+tx.name, Skip, model.ReasonPortName, false, false, port("name", tx.s)))
		add(sliceCase(n(), "text", "slice port name with "+tx.name, Skip, model.ReasonPortName, false, false, func(o obj) { set(o, "ports.0.name", tx.s) }))
	}
	for _, tx := range texts[:3] {
		add(sliceCase(n(), "text", "slice name with "+tx.name, Skip, model.ReasonName, false, false, func(o obj) { set(o, "metadata.name", tx.s) }))
		add(svcCase(n(), "text", "service-proxy-name label with "+tx.name, Skip, model.ReasonLabel, false, false, func(o obj) {
			set(o, "metadata.labels", obj{"service.kubernetes.io/service-proxy-name": tx.s})
		}))
	}

	// Session affinity.
	for _, v := range []struct {
		t    int
		want Want
		api  bool
	}{{0, SkipPart, false}, {-1, SkipPart, false}, {86401, SkipPart, false}, {1, Accept, true}, {86400, Accept, true}} {
		reason := ""
		if v.want == SkipPart {
			reason = model.ReasonInvalidPart
		}
		add(svcCase(n(), "affinity", "affinity timeout "+strconv.Itoa(v.t), v.want, reason, v.api, true, func(o obj) {
			set(o, "spec.sessionAffinity", "ClientIP")
			set(o, "spec.sessionAffinityConfig", obj{"clientIP": obj{"timeoutSeconds": v.t}})
		}))
	}
	add(svcCase(n(), "affinity", "session affinity Bogus", Accept, "", false, true, func(o obj) { set(o, "spec.sessionAffinity", "Bogus") }))

	// Types and policies.
	add(svcCase(n(), "type", "type Bogus", Accept, "", false, true, func(o obj) { set(o, "spec.type", "Bogus") }))
	add(svcCase(n(), "type", "ExternalName with a cluster IP", NotProxied, "", false, false, func(o obj) {
		set(o, "spec.type", "ExternalName")
		set(o, "spec.externalName", "web.example")
	}))
	add(svcCase(n(), "type", "headless (clusterIP None)", NotProxied, "", true, false, func(o obj) {
		set(o, "spec.clusterIP", "None")
		set(o, "spec.clusterIPs", []any{"None"})
	}))
	add(svcCase(n(), "type", "external traffic policy Bogus", Accept, "", false, true, func(o obj) {
		nodePortType(o)
		set(o, "spec.externalTrafficPolicy", "Bogus")
	}))
	add(svcCase(n(), "type", "spec a string", Skip, ReasonUndecodable, false, false, func(o obj) { o["spec"] = "ClusterIP" }))
	add(svcCase(n(), "type", "ports an object", Skip, ReasonUndecodable, false, false, func(o obj) { set(o, "spec.ports", obj{"http": 80}) }))

	// Nodes other than kproxy's own: not read (kproxy reads its own Node
	// only, and checks that one), unless the file source cannot decode
	// them.
	add(nodeCase(n(), "another node's name with a quote", Ignore, "", false, func(o obj) { set(o, "metadata.name", `node"x`) }))
	add(nodeCase(n(), "another node's name 254 characters", Ignore, "", false, func(o obj) {
		set(o, "metadata.name", strings.Repeat(long(63)+".", 3)+long(62))
	}))
	add(nodeCase(n(), "another node's zone label with a newline", Ignore, "", false, func(o obj) {
		set(o, "metadata.labels", obj{"topology.kubernetes.io/zone": "zone\nb"})
	}))
	add(nodeCase(n(), "node status a list", Skip, ReasonUndecodable, false, func(o obj) { o["status"] = []any{1} }))

	// Not Kubernetes objects at all (items of the List).
	add(itemCase(n(), "an object without kind", "other", false, obj{"hello": "world"}))
	add(itemCase(n(), "a string", "other", false, "just a string"))
	add(itemCase(n(), "a number", "other", false, 42))
	add(itemCase(n(), "a list", "other", false, []any{1, 2}))
	add(itemCase(n(), "a Service of apiVersion v2", "Service", false, obj{"apiVersion": "v2", "kind": "Service", "metadata": obj{"name": "mc-v2", "namespace": Namespace}}))
	add(itemCase(n(), "an EndpointSlice of apiVersion discovery.k8s.io/v1beta1", "EndpointSlice", false,
		obj{"apiVersion": "discovery.k8s.io/v1beta1", "kind": "EndpointSlice", "metadata": obj{"name": "mc-beta", "namespace": Namespace}}))
	add(itemCase(n(), "a Service whose name is a number", "Service", false, obj{"apiVersion": "v1", "kind": "Service", "metadata": obj{"name": 7}}))
	add(itemCase(n(), "an EndpointSlice whose endpoints are a string", "EndpointSlice", false,
		obj{"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": obj{"name": "mc-eps", "namespace": Namespace}, "endpoints": "x"}))
	{
		k := n()
		add(Case{Name: "a Deployment (a kind kproxy does not read)", Category: "not-kubernetes", Want: Ignore, APIAccepts: false,
			Objects:   []any{obj{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": obj{"name": "mc-deploy", "namespace": Namespace}}},
			ClusterIP: ClusterIPOf(k), Endpoint: EndpointOf(k), Object: Namespace + "/mc-deploy"})
	}
	return cs
}
