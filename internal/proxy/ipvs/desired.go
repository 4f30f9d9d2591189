// Package ipvs is --proxy-mode ipvs: upstream kube-proxy's IPVS layout
// (kube-ipvs0, IPVS virtual servers, its ipsets and iptables chains).
// Render (pure) turns one family's model state into a Desired; the
// proxier diffs a Desired against what the kernel holds and changes only
// the difference.
package ipvs

import (
	"net/netip"

	"github.com/kproxy/kproxy/internal/kernel/ipset"
	"github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
)

// Desired is everything one IP family of ipvs mode wants in the kernel.
type Desired struct {
	// Addresses go on kube-ipvs0: ClusterIPs, external IPs, load
	// balancer ingress IPs.
	Addresses []netip.Addr
	// Services are the IPVS virtual servers with their real servers.
	Services map[ipvs.VirtualServer]*VirtualServer
	// Sets are upstream's ipsets of this family with their members, by
	// name (KUBE-CLUSTER-IP, KUBE-6-CLUSTER-IP, ...).
	Sets map[string]*Set
	// IPTables is the iptables-restore input for the nat and filter
	// tables (upstream's ipvs mode chains), written with --noflush.
	IPTables []byte
	// Health is what a sync reports to the loop (health.go): the health
	// check node ports with their local endpoint counts, and the Local
	// policies without a local endpoint.
	Health proxy.Result
}

// VirtualServer is one IPVS service with its real servers.
type VirtualServer struct {
	ipvs.Service
	// Name is the service port it belongs to (logs, metrics).
	Name  model.ServicePortName
	Reals []ipvs.Destination
}

// Set is one ipset with the members it should hold.
type Set struct {
	ipset.Set
	Entries []string
}
