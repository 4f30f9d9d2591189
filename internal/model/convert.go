package model

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
	"unique"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	netutils "k8s.io/utils/net"
)

// SkipService reports why a Service is not proxied at all, or "" when it is.
// Invalid services are not skipped here; ConvertService reports them.
func SkipService(svc *v1.Service) string {
	if _, ok := svc.Labels[LabelServiceProxyName]; ok {
		return "label " + LabelServiceProxyName + " hands it to another proxy"
	}
	// Upstream's informers select only objects without this label, Services
	// as well as EndpointSlices.
	if _, ok := svc.Labels[LabelHeadless]; ok {
		return "label " + LabelHeadless
	}
	if svc.Spec.Type == v1.ServiceTypeExternalName {
		return "type ExternalName"
	}
	if svc.Spec.ClusterIP == v1.ClusterIPNone {
		return "headless"
	}
	if svc.Spec.ClusterIP == "" && len(svc.Spec.ClusterIPs) == 0 {
		return "no cluster IP"
	}
	return ""
}

// ConvertService turns a Service into its ports, per IP family, for the
// families this node proxies. Parts that are invalid are left out and
// reported; when the cluster IP itself is invalid the whole service is
// left out. A skipped service (see SkipService) yields nothing.
func ConvertService(svc *v1.Service, families []v1.IPFamily) (map[v1.IPFamily]map[ServicePortName]*ServicePort, []*InvalidError) {
	// What the API server would refuse is not proxied at all (see
	// ValidateService), whatever else the object says.
	if errs := ValidateService(svc); len(errs) > 0 {
		return nil, errs
	}
	if SkipService(svc) != "" {
		return nil, nil
	}
	key := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	obj := key.String()
	var errs []*InvalidError
	bad := func(field, format string, args ...any) {
		errs = append(errs, invalid("Service", obj, field, format, args...))
	}

	// Cluster IPs: spec.clusterIPs wins; spec.clusterIP is its first entry.
	clusterIPs := map[v1.IPFamily]netip.Addr{}
	ipStrings := svc.Spec.ClusterIPs
	field := "spec.clusterIPs"
	if len(ipStrings) == 0 {
		ipStrings, field = []string{svc.Spec.ClusterIP}, "spec.clusterIP"
	}
	for i, s := range ipStrings {
		a, err := parseAddr(s)
		if err != nil {
			f := field
			if len(svc.Spec.ClusterIPs) > 0 {
				f += "[" + strconv.Itoa(i) + "]"
			}
			bad(f, "invalid IP %q, service skipped", s)
			errs[len(errs)-1].Whole = true
			return nil, errs
		}
		f := FamilyOf(a)
		if _, dup := clusterIPs[f]; dup {
			bad(field, "two %s addresses, service skipped", f)
			errs[len(errs)-1].Whole = true
			return nil, errs
		}
		clusterIPs[f] = a
	}

	externalIPs := map[v1.IPFamily][]netip.Addr{}
	for i, s := range svc.Spec.ExternalIPs {
		if strings.TrimSpace(s) == "" {
			continue // not validated by the API server; upstream ignores these quietly
		}
		a, err := parseAddr(s)
		if err != nil {
			bad("spec.externalIPs["+strconv.Itoa(i)+"]", "invalid IP %q, ignored", s)
			continue
		}
		externalIPs[FamilyOf(a)] = append(externalIPs[FamilyOf(a)], a)
	}
	// Like upstream, the load balancer status and source ranges are read
	// whatever the service type (the status may lag a change of type).
	ingress := map[v1.IPFamily][]LoadBalancerIngress{}
	for i, in := range svc.Status.LoadBalancer.Ingress {
		if in.IP == "" {
			continue // hostname-only ingress: nothing to program
		}
		a, err := parseAddr(in.IP)
		if err != nil {
			bad("status.loadBalancer.ingress["+strconv.Itoa(i)+"].ip", "invalid IP %q, ignored", in.IP)
			continue
		}
		// Only an unset mode or VIP is a VIP (upstream's IsVIPMode).
		proxy := in.IPMode != nil && *in.IPMode != v1.LoadBalancerIPModeVIP
		ingress[FamilyOf(a)] = append(ingress[FamilyOf(a)], LoadBalancerIngress{IP: a, Proxy: proxy})
	}
	ranges := map[v1.IPFamily][]netip.Prefix{}
	for i, s := range svc.Spec.LoadBalancerSourceRanges {
		if strings.TrimSpace(s) == "" {
			continue // as upstream
		}
		p, err := parsePrefix(s)
		if err != nil {
			bad("spec.loadBalancerSourceRanges["+strconv.Itoa(i)+"]", "invalid CIDR %q, ignored", s)
			continue
		}
		ranges[FamilyOf(p.Addr())] = append(ranges[FamilyOf(p.Addr())], p)
	}

	var sticky int32
	if svc.Spec.SessionAffinity == v1.ServiceAffinityClientIP {
		sticky = DefaultStickyMaxAgeSeconds
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			t := *c.ClientIP.TimeoutSeconds
			if t <= 0 || t > 86400 {
				bad("spec.sessionAffinityConfig.clientIP.timeoutSeconds", "%d is outside 1..86400, using the default %d", t, DefaultStickyMaxAgeSeconds)
			} else {
				sticky = t
			}
		}
	}

	externallyAccessible := svc.Spec.Type == v1.ServiceTypeLoadBalancer || svc.Spec.Type == v1.ServiceTypeNodePort ||
		(svc.Spec.Type == v1.ServiceTypeClusterIP && len(svc.Spec.ExternalIPs) > 0)
	externalLocal := externallyAccessible && svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
	internalLocal := svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal
	var hcPort int32
	if externalLocal && svc.Spec.Type == v1.ServiceTypeLoadBalancer {
		hcPort = svc.Spec.HealthCheckNodePort
		if hcPort < 0 || hcPort > 65535 {
			bad("spec.healthCheckNodePort", "%d is out of range, ignored", hcPort)
			hcPort = 0
		}
	}

	var created int64
	if !svc.CreationTimestamp.IsZero() {
		created = svc.CreationTimestamp.Unix()
	}

	out := map[v1.IPFamily]map[ServicePortName]*ServicePort{}
	for i, sp := range svc.Spec.Ports {
		pf := "spec.ports[" + strconv.Itoa(i) + "]"
		proto := sp.Protocol
		if proto == "" {
			proto = v1.ProtocolTCP
		}
		if proto != TCP && proto != UDP && proto != SCTP {
			bad(pf+".protocol", "unknown protocol %q, port skipped", sp.Protocol)
			continue
		}
		if sp.Port < 1 || sp.Port > 65535 {
			bad(pf+".port", "%d is out of range 1..65535, port skipped", sp.Port)
			continue
		}
		nodePort := sp.NodePort
		if nodePort < 0 || nodePort > 65535 {
			bad(pf+".nodePort", "%d is out of range, ignored", nodePort)
			nodePort = 0
		}
		if svc.Spec.Type != v1.ServiceTypeNodePort && svc.Spec.Type != v1.ServiceTypeLoadBalancer {
			nodePort = 0
		}
		// Port names are unique (ValidateService checked them).
		name := ServicePortName{NamespacedName: key, Port: sp.Name, Protocol: proto}
		for _, f := range families {
			cip, ok := clusterIPs[f]
			if !ok {
				continue
			}
			if out[f] == nil {
				out[f] = map[ServicePortName]*ServicePort{}
			}
			out[f][name] = &ServicePort{
				Name:                     name,
				Family:                   f,
				Type:                     svc.Spec.Type,
				ClusterIP:                cip,
				Port:                     sp.Port,
				Protocol:                 proto,
				TargetPort:               sp.TargetPort.String(),
				NodePort:                 nodePort,
				ExternalIPs:              externalIPs[f],
				LoadBalancerIngress:      ingress[f],
				LoadBalancerSourceRanges: ranges[f],
				// Ranges of the other family only close this one (a
				// deliberate difference from upstream, which opens it).
				LoadBalancerClosed:  len(ranges[f]) == 0 && len(ranges) > 0,
				StickyMaxAgeSeconds: sticky,
				ExternalPolicyLocal: externalLocal,
				InternalPolicyLocal: internalLocal,
				HealthCheckNodePort: hcPort,
				Created:             created,
			}
		}
	}
	return out, errs
}

var (
	errZone   = errors.New("address with a zone")
	errNotIP  = errors.New("not an IP address")
	errMapped = errors.New("IPv4-mapped IPv6 prefix")
)

// parseAddr parses an IP as upstream does: IPv4 octets may have leading
// zeros (read as decimal), which older API servers accepted and stored but
// Go's parsers reject since Go 1.17.
func parseAddr(s string) (netip.Addr, error) {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "%") {
		return netip.Addr{}, errZone
	}
	ip := netutils.ParseIPSloppy(s)
	if ip == nil {
		return netip.Addr{}, errNotIP
	}
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap(), nil
}

// parsePrefix parses a CIDR the same way, with the host bits masked.
func parsePrefix(s string) (netip.Prefix, error) {
	_, n, err := netutils.ParseCIDRSloppy(strings.TrimSpace(s))
	if err != nil {
		return netip.Prefix{}, err
	}
	a, _ := netip.AddrFromSlice(n.IP)
	if a.Is4In6() {
		// Its family would be ambiguous; the API server rejects these.
		return netip.Prefix{}, errMapped
	}
	ones, _ := n.Mask.Size()
	p := netip.PrefixFrom(a, ones)
	if !p.IsValid() {
		return netip.Prefix{}, fmt.Errorf("invalid prefix %q", s)
	}
	return p, nil
}

// ServiceKeyOfSlice returns the Service an EndpointSlice belongs to.
func ServiceKeyOfSlice(s *discovery.EndpointSlice) (types.NamespacedName, bool) {
	name := s.Labels[discovery.LabelServiceName]
	return types.NamespacedName{Namespace: s.Namespace, Name: name}, name != ""
}

// TriggerTime reads the slice's last-change-trigger-time annotation.
func TriggerTime(s *discovery.EndpointSlice) (time.Time, bool) {
	v, ok := s.Annotations[AnnotationTriggerTime]
	if !ok {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	return t, err == nil
}

// ConvertEndpointSlices merges all slices of one Service into endpoints per
// family and service port. Endpoints are deduplicated by address and port
// (see betterDuplicate) and sorted. hostname is this node's name. It is
// convertSlice of each slice, in order of name, then mergeSlices: what the
// Tracker does, one slice at a time.
func ConvertEndpointSlices(slicesOfService []*discovery.EndpointSlice, hostname string, families []v1.IPFamily) (map[v1.IPFamily]map[ServicePortName][]*Endpoint, []*InvalidError) {
	var errs []*InvalidError
	// Deterministic order: a duplicate is resolved the same way every time.
	sorted := slices.Clone(slicesOfService)
	slices.SortFunc(sorted, func(a, b *discovery.EndpointSlice) int { return cmp.Compare(a.Name, b.Name) })
	conv := make([]*convertedSlice, 0, len(sorted))
	for _, s := range sorted {
		if verrs := ValidateEndpointSlice(s); len(verrs) > 0 {
			errs = append(errs, verrs...)
			continue
		}
		if _, ok := ServiceKeyOfSlice(s); !ok {
			errs = append(errs, noServiceLabel(s))
			continue
		}
		c, cerrs := convertSlice(s, hostname, families)
		errs = append(errs, cerrs...)
		conv = append(conv, c)
	}
	out := map[v1.IPFamily]map[ServicePortName][]*Endpoint{}
	for _, p := range mergeSlices(conv) {
		if out[p.family] == nil {
			out[p.family] = map[ServicePortName][]*Endpoint{}
		}
		out[p.family][p.name] = p.eps
	}
	return out, errs
}

// convertedSlice is one EndpointSlice as the proxy needs it: its endpoints
// per family and service port, deduplicated and sorted.
type convertedSlice struct {
	name  string
	ports []slicePort
}

// slicePort is the endpoints of one service port in one family.
type slicePort struct {
	family v1.IPFamily
	name   ServicePortName
	eps    []*Endpoint
}

type slicePortKey struct {
	family v1.IPFamily
	name   ServicePortName
}

// endpointMerge deduplicates endpoints by service port, address and port.
type endpointMerge struct {
	byPort map[slicePortKey]map[netip.AddrPort]*Endpoint
}

// add keeps e unless an endpoint added before for the same address and port
// is at least as good (see betterDuplicate).
func (m *endpointMerge) add(k slicePortKey, e *Endpoint) {
	if m.byPort == nil {
		m.byPort = map[slicePortKey]map[netip.AddrPort]*Endpoint{}
	}
	b := m.byPort[k]
	if b == nil {
		b = map[netip.AddrPort]*Endpoint{}
		m.byPort[k] = b
	}
	if old, dup := b[e.AddrPort()]; dup && !betterDuplicate(e, old) {
		return
	}
	b[e.AddrPort()] = e
}

// ports returns what was added, sorted by family, service port and
// endpoint.
func (m *endpointMerge) ports() []slicePort {
	out := make([]slicePort, 0, len(m.byPort))
	for k, b := range m.byPort {
		list := make([]*Endpoint, 0, len(b))
		for _, e := range b {
			list = append(list, e)
		}
		slices.SortFunc(list, CompareEndpoints)
		out = append(out, slicePort{family: k.family, name: k.name, eps: list})
	}
	slices.SortFunc(out, func(a, b slicePort) int {
		if c := cmp.Compare(a.family, b.family); c != 0 {
			return c
		}
		return a.name.Compare(b.name)
	})
	return out
}

// mergeSlices merges a service's converted slices, given in order of name:
// of endpoints with the same address and port the better one is kept, the
// earlier slice's when neither is. A single slice is returned as it is.
func mergeSlices(list []*convertedSlice) []slicePort {
	switch len(list) {
	case 0:
		return nil
	case 1:
		return list[0].ports
	}
	var m endpointMerge
	for _, c := range list {
		for _, p := range c.ports {
			for _, e := range p.eps {
				m.add(slicePortKey{p.family, p.name}, e)
			}
		}
	}
	return m.ports()
}

// noServiceLabel is the error of a slice without the service-name label:
// it belongs to no Service, and is skipped whole.
func noServiceLabel(s *discovery.EndpointSlice) *InvalidError {
	e := invalid("EndpointSlice", s.Namespace+"/"+s.Name, "metadata.labels", "no %s label, slice skipped", discovery.LabelServiceName)
	e.Category, e.Whole = ReasonServiceNameLabel, true
	return e
}

// convertSlice converts one EndpointSlice (without ports when none of it is
// usable). The slice has passed ValidateEndpointSlice.
func convertSlice(s *discovery.EndpointSlice, hostname string, families []v1.IPFamily) (*convertedSlice, []*InvalidError) {
	var errs []*InvalidError
	var m endpointMerge
	obj := s.Namespace + "/" + s.Name
	bad := func(field, format string, args ...any) {
		errs = append(errs, invalid("EndpointSlice", obj, field, format, args...))
	}
	svcKey, ok := ServiceKeyOfSlice(s)
	if !ok {
		return &convertedSlice{name: s.Name}, append(errs, noServiceLabel(s))
	}
	var fam v1.IPFamily
	switch s.AddressType {
	case discovery.AddressTypeIPv4:
		fam = IPv4
	case discovery.AddressTypeIPv6:
		fam = IPv6
	case discovery.AddressTypeFQDN:
		return &convertedSlice{name: s.Name}, errs // not proxied, as upstream
	default:
		bad("addressType", "unknown address type %q, slice skipped", s.AddressType)
		return &convertedSlice{name: s.Name}, errs
	}
	if !slices.Contains(families, fam) {
		return &convertedSlice{name: s.Name}, errs
	}
	type portOf struct {
		name ServicePortName
		port int32
	}
	var ports []portOf
	for i, p := range s.Ports {
		pf := "ports[" + strconv.Itoa(i) + "]"
		// The API allows a nil name; upstream skips such a port (an
		// unnamed port has the name "").
		if p.Name == nil {
			bad(pf+".name", "missing, port skipped")
			continue
		}
		if p.Port == nil {
			bad(pf+".port", "missing, port skipped")
			continue
		}
		if *p.Port < 1 || *p.Port > 65535 {
			bad(pf+".port", "%d is out of range 1..65535, port skipped", *p.Port)
			continue
		}
		proto := v1.ProtocolTCP
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		if proto != TCP && proto != UDP && proto != SCTP {
			bad(pf+".protocol", "unknown protocol %q, port skipped", proto)
			continue
		}
		ports = append(ports, portOf{ServicePortName{NamespacedName: svcKey, Port: *p.Name, Protocol: proto}, *p.Port})
	}
	for i, ep := range s.Endpoints {
		ef := "endpoints[" + strconv.Itoa(i) + "]"
		if len(ep.Addresses) == 0 {
			bad(ef+".addresses", "Required value: must contain at least 1 address; endpoint skipped")
			continue
		}
		// Like upstream, only the first address is used.
		a, err := parseAddr(ep.Addresses[0])
		if err != nil {
			bad(ef+".addresses[0]", "Invalid value: %q: must be a valid IP address; endpoint skipped", ep.Addresses[0])
			continue
		}
		if FamilyOf(a) != fam {
			bad(ef+".addresses[0]", "Invalid value: %q: must be an %s address (addressType %s); endpoint skipped", ep.Addresses[0], fam, s.AddressType)
			continue
		}
		// The API says nil ready and nil serving both mean true; upstream
		// reads them so (serving does not follow an explicit ready=false).
		ready := ep.Conditions.Ready == nil || *ep.Conditions.Ready
		serving := ep.Conditions.Serving == nil || *ep.Conditions.Serving
		terminating := ep.Conditions.Terminating != nil && *ep.Conditions.Terminating
		var node, zone string
		if ep.NodeName != nil {
			// Interned: a cluster has few node names and zones, and a
			// decoded slice has a copy of each per endpoint.
			node = unique.Make(*ep.NodeName).Value()
		}
		if ep.Zone != nil {
			zone = unique.Make(*ep.Zone).Value()
		}
		var zoneHints, nodeHints sets.Set[string]
		if ep.Hints != nil {
			for _, z := range ep.Hints.ForZones {
				if zoneHints == nil {
					zoneHints = sets.New[string]()
				}
				zoneHints.Insert(z.Name)
			}
			for _, n := range ep.Hints.ForNodes {
				if nodeHints == nil {
					nodeHints = sets.New[string]()
				}
				nodeHints.Insert(n.Name)
			}
		}
		for _, p := range ports {
			e := &Endpoint{
				IP: a, Port: p.port,
				Ready: ready, Serving: serving, Terminating: terminating,
				NodeName: node, Zone: zone, Local: node != "" && node == hostname,
				ZoneHints: zoneHints, NodeHints: nodeHints,
			}
			m.add(slicePortKey{fam, p.name}, e)
		}
	}
	return &convertedSlice{name: s.Name, ports: m.ports()}, errs
}

// betterDuplicate tells whether e should replace old, an endpoint with the
// same address and port from an earlier slice. As upstream, a copy that is
// not terminating wins over a terminating one: the pod network may have
// given the IP of a terminating pod to a new pod. Beyond that (where
// upstream's choice depends on map order) a ready copy wins, then the
// earlier slice by name.
func betterDuplicate(e, old *Endpoint) bool {
	if e.Terminating != old.Terminating {
		return !e.Terminating
	}
	return e.Ready && !old.Ready
}

// ConvertNode turns a Node object into what the proxy needs; nil when the
// API server would refuse the Node (see ValidateNode).
func ConvertNode(n *v1.Node) (*Node, []*InvalidError) {
	if errs := ValidateNode(n); len(errs) > 0 {
		return nil, errs
	}
	var errs []*InvalidError
	node := &Node{Name: n.Name, Labels: n.Labels, Object: n}
	cidrs := n.Spec.PodCIDRs
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs = []string{n.Spec.PodCIDR}
	}
	for i, c := range cidrs {
		p, err := parsePrefix(c)
		if err != nil {
			errs = append(errs, invalid("Node", n.Name, "spec.podCIDRs["+strconv.Itoa(i)+"]", "invalid CIDR %q, ignored", c))
			continue
		}
		node.PodCIDRs = append(node.PodCIDRs, p)
	}
	// InternalIPs first, then ExternalIPs, each in status order: the
	// order upstream's GetNodeHostIPs picks the node's primary IPs in.
	for _, typ := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
		for _, a := range n.Status.Addresses {
			if a.Type != typ {
				continue
			}
			ip, err := parseAddr(a.Address)
			if err != nil {
				errs = append(errs, invalid("Node", n.Name, "status.addresses", "invalid %s %q, ignored", a.Type, a.Address))
				continue
			}
			node.Addresses = append(node.Addresses, ip)
		}
	}
	node.Deleting = n.DeletionTimestamp != nil
	for _, t := range n.Spec.Taints {
		if t.Key == TaintToBeDeleted {
			node.Deleting = true
		}
	}
	return node, errs
}
