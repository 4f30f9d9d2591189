// Package ipvs is --proxy-mode ipvs: upstream kube-proxy's IPVS layout
// (kube-ipvs0, IPVS virtual servers, its ipsets and iptables chains).
// Render (pure) turns one family's model state into a Desired; the
// proxier diffs a Desired against what the kernel holds and changes only
// the difference.
package ipvs
