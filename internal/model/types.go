// Package model holds what a proxy needs to know about Services, their
// endpoints and this Node, per IP family, independent of where that knowledge
// comes from (API server or file) and of how it is programmed into the kernel.
//
// Data flows one way: a source feeds Kubernetes objects into a Tracker; the
// Tracker folds them into per-family deltas; a proxier applies each delta to
// its own State and renders rules from it. Nothing in this package talks to
// the API server or the kernel.
package model

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
)

// Protocols a Service port may use.
const (
	TCP  = v1.ProtocolTCP
	UDP  = v1.ProtocolUDP
	SCTP = v1.ProtocolSCTP
)

// IP families.
const (
	IPv4 = v1.IPv4Protocol
	IPv6 = v1.IPv6Protocol
)

// Well-known names read from objects.
const (
	// LabelServiceProxyName marks a Service that another proxy handles.
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	// LabelHeadless marks the EndpointSlices of headless services.
	LabelHeadless = "service.kubernetes.io/headless"
	// AnnotationTriggerTime is set by the EndpointSlice controller to the
	// time of the change that caused the slice to be written; network
	// programming latency is measured from it.
	AnnotationTriggerTime = "endpoints.kubernetes.io/last-change-trigger-time"
	// TaintToBeDeleted is put on a Node by the cluster autoscaler before
	// it removes it; load balancers should stop sending traffic to it.
	TaintToBeDeleted = "ToBeDeletedByClusterAutoscaler"
	// DefaultStickyMaxAgeSeconds is the API default of
	// sessionAffinityConfig.clientIP.timeoutSeconds.
	DefaultStickyMaxAgeSeconds = 10800
)

// FamilyOf returns the IP family of an address.
func FamilyOf(a netip.Addr) v1.IPFamily {
	if a.Is4() || a.Is4In6() {
		return IPv4
	}
	return IPv6
}

// ServicePortName identifies one port of one Service; it is the key of
// everything in this package.
type ServicePortName struct {
	types.NamespacedName
	Port     string
	Protocol v1.Protocol
}

// String gives upstream's form: "ns/name:port" (":port" omitted for an
// unnamed port) with the protocol appended for clarity.
func (n ServicePortName) String() string {
	s := n.NamespacedName.String()
	if n.Port != "" {
		s += ":" + n.Port
	}
	return s + "/" + string(n.Protocol)
}

// Compare orders names for deterministic output.
func (n ServicePortName) Compare(o ServicePortName) int {
	if c := strings.Compare(n.Namespace, o.Namespace); c != 0 {
		return c
	}
	if c := strings.Compare(n.Name, o.Name); c != 0 {
		return c
	}
	if c := strings.Compare(n.Port, o.Port); c != 0 {
		return c
	}
	return strings.Compare(string(n.Protocol), string(o.Protocol))
}

// LoadBalancerIngress is one address of status.loadBalancer.ingress.
type LoadBalancerIngress struct {
	IP netip.Addr
	// Proxy is true for ipMode: Proxy, and for any other mode than VIP
	// (unset means VIP), as upstream's IsVIPMode: the load balancer
	// forwards to the node with its own address as destination, so the
	// node must not short-circuit the LB IP itself.
	Proxy bool
}

// ServicePort is what a proxy needs of one Service port in one IP family.
type ServicePort struct {
	Name   ServicePortName
	Family v1.IPFamily
	Type   v1.ServiceType

	ClusterIP netip.Addr
	Port      int32
	Protocol  v1.Protocol
	// TargetPort is informational (endpoints carry the real port).
	TargetPort string
	NodePort   int32

	ExternalIPs              []netip.Addr
	LoadBalancerIngress      []LoadBalancerIngress
	LoadBalancerSourceRanges []netip.Prefix
	// LoadBalancerClosed is set when the Service has source ranges but
	// none of this family: its LB VIPs in this family accept no client.
	// A deliberate difference from upstream, which filters the ranges per
	// family and leaves the family open when none is left: the operator
	// who wrote source ranges meant to restrict.
	LoadBalancerClosed bool

	// StickyMaxAgeSeconds > 0 means ClientIP session affinity.
	StickyMaxAgeSeconds int32

	ExternalPolicyLocal bool
	InternalPolicyLocal bool
	HealthCheckNodePort int32

	// Created is the Service's metadata.creationTimestamp in Unix
	// seconds (0: unknown). It decides who keeps an address two services
	// claim (see resolve.go), not how the port is programmed.
	Created int64
}

// SessionAffinity reports whether ClientIP affinity is on.
func (p *ServicePort) SessionAffinity() bool { return p.StickyMaxAgeSeconds > 0 }

// LoadBalancerVIPs are the ingress IPs the node itself should treat as the
// service's (ipMode VIP or unset). ipMode Proxy IPs are left out, as
// upstream does, so traffic to them goes out to the real load balancer.
func (p *ServicePort) LoadBalancerVIPs() []netip.Addr {
	var out []netip.Addr
	for _, in := range p.LoadBalancerIngress {
		if !in.Proxy {
			out = append(out, in.IP)
		}
	}
	return out
}

// UsesLoadBalancerFirewall is true when traffic to the LB VIPs is
// filtered by source: the port has VIPs and source ranges of its family,
// or is closed to this family (LoadBalancerClosed).
func (p *ServicePort) UsesLoadBalancerFirewall() bool {
	return len(p.LoadBalancerVIPs()) > 0 && (len(p.LoadBalancerSourceRanges) > 0 || p.LoadBalancerClosed)
}

// ExternallyAccessible is true when traffic can reach the service from
// outside the cluster: a NodePort, an external IP or a load balancer VIP.
func (p *ServicePort) ExternallyAccessible() bool {
	return p.NodePort != 0 || len(p.ExternalIPs) > 0 || len(p.LoadBalancerVIPs()) > 0
}

// UsesClusterEndpoints is true when some traffic goes to endpoints on any node.
// An externally accessible port needs them even when both traffic policies
// are Local: traffic from pods on this node to a node port, external IP or
// LB VIP is short-circuited to all endpoints, as upstream does.
func (p *ServicePort) UsesClusterEndpoints() bool {
	return !p.InternalPolicyLocal || p.ExternallyAccessible()
}

// UsesLocalEndpoints is true when some traffic goes only to this node's endpoints.
func (p *ServicePort) UsesLocalEndpoints() bool {
	return p.InternalPolicyLocal || (p.ExternallyAccessible() && p.ExternalPolicyLocal)
}

// Equal compares two service ports field by field.
func (p *ServicePort) Equal(o *ServicePort) bool {
	if p == nil || o == nil {
		return p == o
	}
	return p.Name == o.Name && p.Family == o.Family && p.Type == o.Type &&
		p.ClusterIP == o.ClusterIP && p.Port == o.Port && p.Protocol == o.Protocol &&
		p.TargetPort == o.TargetPort && p.NodePort == o.NodePort &&
		slices.Equal(p.ExternalIPs, o.ExternalIPs) &&
		slices.Equal(p.LoadBalancerIngress, o.LoadBalancerIngress) &&
		slices.Equal(p.LoadBalancerSourceRanges, o.LoadBalancerSourceRanges) &&
		p.LoadBalancerClosed == o.LoadBalancerClosed &&
		p.StickyMaxAgeSeconds == o.StickyMaxAgeSeconds &&
		p.ExternalPolicyLocal == o.ExternalPolicyLocal &&
		p.InternalPolicyLocal == o.InternalPolicyLocal &&
		p.HealthCheckNodePort == o.HealthCheckNodePort && p.Created == o.Created
}

// Endpoint is one backend of a service port.
type Endpoint struct {
	IP   netip.Addr
	Port int32

	Ready       bool
	Serving     bool
	Terminating bool
	// Local is true when NodeName is this node. (Next to the other flags:
	// 80 bytes an endpoint instead of 88, which the allocator rounded to
	// 96, at 100k endpoints.)
	Local bool

	NodeName string
	Zone     string

	ZoneHints sets.Set[string]
	NodeHints sets.Set[string]
}

// AddrPort returns the endpoint's address and port.
func (e *Endpoint) AddrPort() netip.AddrPort {
	return netip.AddrPortFrom(e.IP, uint16(e.Port))
}

// String is "ip:port" ("[ip]:port" for IPv6).
func (e *Endpoint) String() string { return e.AddrPort().String() }

// CompareEndpoints orders endpoints as upstream does (pkg/proxy
// endpointslicecache.go, byEndpoint): by their "ip:port" text, not by
// address. The order decides which endpoint each probability of the
// iptables dispatch rules lands on ("198.18.1.10:80" before
// "198.18.1.9:80"), so it has to be upstream's for the rules to be the
// same.
func CompareEndpoints(a, b *Endpoint) int {
	// [ip]:port is at most 47 bytes: formatted on the stack.
	var x, y [64]byte
	return bytes.Compare(a.AddrPort().AppendTo(x[:0]), b.AddrPort().AppendTo(y[:0]))
}

// Equal compares two endpoints field by field.
func (e *Endpoint) Equal(o *Endpoint) bool {
	if e == nil || o == nil {
		return e == o
	}
	return e.IP == o.IP && e.Port == o.Port && e.Ready == o.Ready &&
		e.Serving == o.Serving && e.Terminating == o.Terminating &&
		e.NodeName == o.NodeName && e.Zone == o.Zone && e.Local == o.Local &&
		e.ZoneHints.Equal(o.ZoneHints) && e.NodeHints.Equal(o.NodeHints)
}

func endpointsEqual(a, b []*Endpoint) bool {
	return slices.EqualFunc(a, b, (*Endpoint).Equal)
}

// Node is what the proxy needs of its own Node object.
type Node struct {
	Name     string
	Labels   map[string]string
	PodCIDRs []netip.Prefix
	// Addresses are the node's InternalIPs, then its ExternalIPs.
	Addresses []netip.Addr
	// Deleting is true when the Node has a deletion timestamp or the
	// cluster autoscaler's ToBeDeleted taint: load balancers should drain it.
	Deleting bool
	// Object is the Node as read, for consumers that need more.
	Object *v1.Node
}

// PrimaryIP is the node's primary IP of family f, as upstream's
// GetNodeHostIPs picks it: the first InternalIP of the family, else its
// first ExternalIP. It is the zero Addr when there is none (or n is nil).
func (n *Node) PrimaryIP(f v1.IPFamily) netip.Addr {
	if n == nil {
		return netip.Addr{}
	}
	for _, a := range n.Addresses {
		if FamilyOf(a) == f {
			return a
		}
	}
	return netip.Addr{}
}

// Zone is the node's topology.kubernetes.io/zone label.
func (n *Node) Zone() string {
	if n == nil {
		return ""
	}
	return n.Labels[v1.LabelTopologyZone]
}

// PodCIDRsOf returns the node's pod CIDRs of one family.
func (n *Node) PodCIDRsOf(f v1.IPFamily) []netip.Prefix {
	if n == nil {
		return nil
	}
	var out []netip.Prefix
	for _, p := range n.PodCIDRs {
		if FamilyOf(p.Addr()) == f {
			out = append(out, p)
		}
	}
	return out
}

// InvalidError describes a part of an object that was skipped.
type InvalidError struct {
	Kind   string // Service, EndpointSlice, Node
	Object string // namespace/name
	Field  string // field path, e.g. spec.ports[1].port
	Reason string
	// Category is a fixed token for the metric's reason label (see
	// ReasonInvalidPart and the other Reason constants).
	Category string
	// Whole is set when the object was skipped whole, not only this part.
	Whole bool
}

func (e *InvalidError) Error() string {
	s := e.Kind + " " + e.Object
	if e.Field != "" {
		s += ": " + e.Field
	}
	return s + ": " + e.Reason
}

func invalid(kind, object, field, format string, args ...any) *InvalidError {
	return &InvalidError{Kind: kind, Object: clip(object), Field: field, Reason: clip(fmt.Sprintf(format, args...)), Category: ReasonInvalidPart}
}

// maxReportText bounds the object name and the reason of an InvalidError:
// a file may hold a name or a value of megabytes (the API server would
// refuse it), and each report is a log line.
const maxReportText = 1024

// maxBadValue bounds the value quoted in a reason.
const maxBadValue = 256

// clip returns s, or its first maxReportText bytes (whole UTF-8
// sequences) and how long it was.
func clip(s string) string { return clipTo(s, maxReportText) }

func clipTo(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + fmt.Sprintf("... (%d bytes in all)", len(s))
}
