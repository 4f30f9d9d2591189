package model

import (
	"fmt"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
	networking "k8s.io/api/networking/v1"
)

// ServiceCIDRPrefixes returns the CIDRs (spec.cidrs) of every ServiceCIDR,
// sorted and without duplicates, and an error for each CIDR that does not
// parse (the API server refuses those; the rest are still used).
//
// Upstream (pkg/proxy/config ServiceCIDRConfig) hands the proxier the
// CIDRs of every ServiceCIDR in its informer, also of those being deleted:
// a ServiceCIDR with a deletionTimestamp still holds allocated addresses
// until its finalizer is removed, so they are not skipped here either.
func ServiceCIDRPrefixes(objs []*networking.ServiceCIDR) ([]netip.Prefix, []*InvalidError) {
	var out []netip.Prefix
	var errs []*InvalidError
	for _, o := range objs {
		for i, s := range o.Spec.CIDRs {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				e := invalid("ServiceCIDR", o.Name, fmt.Sprintf("spec.cidrs[%d]", i), "%q is not a CIDR: %v", s, err)
				errs = append(errs, e)
				continue
			}
			out = append(out, p.Masked())
		}
	}
	slices.SortFunc(out, comparePrefix)
	return slices.Compact(out), errs
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// PrefixesOf returns the prefixes of one IP family.
func PrefixesOf(ps []netip.Prefix, f v1.IPFamily) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if FamilyOf(p.Addr()) == f {
			out = append(out, p)
		}
	}
	return out
}
