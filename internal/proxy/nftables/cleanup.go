package nftables

import (
	"context"
	"errors"

	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

// CleanupLeftovers deletes nftables mode's tables in both families:
// DefaultTableName (upstream's table has that name too) and every shard
// table of it, those of the current shard count and any a larger one
// left. Other tables stay.
func CleanupLeftovers(ctx context.Context, iface nft.Interface) error {
	var errs []error
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		tables, err := iface.ListTables(ctx, f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, t := range OurTables(DefaultTableName, tables) {
			if err := iface.DeleteTable(ctx, f, t); err != nil {
				errs = append(errs, err)
				continue
			}
			klog.InfoS("Deleted nftables table", "family", f, "table", t)
		}
	}
	return errors.Join(errs...)
}
