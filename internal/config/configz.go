package config

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kube-proxy/config/v1alpha1"
)

// Configz returns the configuration as upstream's /configz shows it: a
// copy with the Linux platform defaults applied (an empty mode is
// iptables; in nftables mode an empty nodePortAddresses is [primary]) and
// passed through upstream's internal configuration and back, which keeps
// syncPeriod, minSyncPeriod and masqueradeAll only in the section of the
// mode in use (the others read 0s and false). c itself is left as is: an
// empty mode still means "defaulted" to the rest of kproxy.
func Configz(c *v1alpha1.KubeProxyConfiguration) *v1alpha1.KubeProxyConfiguration {
	out := c.DeepCopy()
	if out.Mode == "" {
		out.Mode = ModeIPTables
	}
	if out.Mode == ModeNFTables && len(out.NodePortAddresses) == 0 {
		out.NodePortAddresses = []string{NodePortAddressesPrimary}
	}
	zero := metav1.Duration{}
	switch out.Mode {
	case ModeIPVS:
		out.IPTables.SyncPeriod, out.IPTables.MinSyncPeriod = zero, zero
		out.NFTables.SyncPeriod, out.NFTables.MinSyncPeriod = zero, zero
		out.NFTables.MasqueradeAll = false
	case ModeNFTables:
		out.IPTables.SyncPeriod, out.IPTables.MinSyncPeriod = zero, zero
		out.IPVS.SyncPeriod, out.IPVS.MinSyncPeriod = zero, zero
		out.IPTables.MasqueradeAll = false
	default:
		out.IPVS.SyncPeriod, out.IPVS.MinSyncPeriod = zero, zero
		out.NFTables.SyncPeriod, out.NFTables.MinSyncPeriod = zero, zero
		out.NFTables.MasqueradeAll = false
	}
	return out
}
