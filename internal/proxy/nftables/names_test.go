package nftables

import (
	"testing"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/testutil/fixtures"
)

// TestIsOurs: only per-service objects may be removed as stale; the fixed
// ones share prefixes with them ("firewall-check" and "firewall-ips" with
// "firewall-<hash>-...", "service-endpoints-check" and "service-ips" with
// "service-<hash>-...").
func TestIsOurs(t *testing.T) {
	n := fixtures.SPName("web", "http", model.TCP)
	e := fixtures.Endpoint("198.18.129.10", 8080, true, nil)
	for _, name := range []string{
		serviceChainName(prefixServiceChain, n), serviceChainName(prefixExternalChain, n),
		serviceChainName(prefixLocalChain, n), serviceChainName(prefixFirewallChain, n),
		endpointChainName(n, e), affinitySetName(n, e, 10800),
	} {
		if !isOurs(name) {
			t.Errorf("isOurs(%q) = false, want true", name)
		}
	}
	for _, name := range fixedNames(&Config{Family: model.IPv4}) {
		if isOurs(name) {
			t.Errorf("isOurs(%q) = true for a fixed chain or set", name)
		}
	}
}

// fixedNames are the names of the fixed chains, sets and maps of the main
// and the shard tables.
func fixedNames(cfg *Config) []string {
	r := &renderer{cfg: cfg}
	var out []string
	for _, l := range []tableLayout{r.mainLayout(), r.shardLayout()} {
		out = append(out, l.chains...)
		for _, b := range l.base {
			out = append(out, b.name)
		}
		for _, s := range l.sets {
			out = append(out, s.Name)
		}
	}
	return out
}
