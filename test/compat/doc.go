// Package compat runs upstream kube-proxy v1.37.2 (built by
// test/tools/build.sh) and kproxy on the same inputs and compares what an
// operator sees: the flags of --help, feature-gate acceptance, /configz for
// real-world configurations, the metric families after a first sync against
// a real API server, the health endpoints, and the sysctls --init-only
// leaves. Every difference is one subtest. Differences kproxy keeps on purpose
// are listed with their reason in intended (known_test.go), and only there;
// differences with a fix under way are in pendingFixes and log instead of
// failing; any other difference fails. The suite writes docs/compatibility.md (go test
// -run TestCompatibility ./test/compat -update) and fails when it is stale.
//
// Addresses: the control plane and the node namespaces use 198.18.250.0/24
// and fd00:18:250::/64 (test/e2e/framework); pod CIDRs in the configurations
// are 198.18.128.0/17 and fd00:18:128::/64; service IPs 198.19.0.0/16.
package compat
