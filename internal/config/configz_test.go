package config

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/kube-proxy/config/v1alpha1"
)

// TestConfigz: what /configz shows after defaulting, as upstream's (its
// platformApplyDefaults, then the round trip through the internal
// configuration): mode and nodePortAddresses filled in, sync periods and
// masqueradeAll only in the section of the mode in use.
func TestConfigz(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*v1alpha1.KubeProxyConfiguration)
		want map[string]any
	}{{
		name: "mode left empty",
		edit: func(c *v1alpha1.KubeProxyConfiguration) { c.NFTables.MasqueradeAll = true },
		want: map[string]any{
			"mode": "iptables", "nodePortAddresses": nil,
			"iptables": map[string]any{"syncPeriod": "30s", "minSyncPeriod": "1s", "masqueradeAll": false},
			"nftables": map[string]any{"syncPeriod": "0s", "minSyncPeriod": "0s", "masqueradeAll": false},
			"ipvs":     map[string]any{"syncPeriod": "0s", "minSyncPeriod": "0s"},
		},
	}, {
		name: "nftables",
		edit: func(c *v1alpha1.KubeProxyConfiguration) { c.Mode = ModeNFTables; c.NFTables.MasqueradeAll = true },
		want: map[string]any{
			"mode": "nftables", "nodePortAddresses": []any{"primary"},
			"iptables": map[string]any{"syncPeriod": "0s", "minSyncPeriod": "0s", "masqueradeAll": false},
			"nftables": map[string]any{"syncPeriod": "30s", "minSyncPeriod": "1s", "masqueradeAll": true},
			"ipvs":     map[string]any{"syncPeriod": "0s", "minSyncPeriod": "0s"},
		},
	}, {
		name: "nftables with nodePortAddresses",
		edit: func(c *v1alpha1.KubeProxyConfiguration) { c.Mode = ModeNFTables; c.NodePortAddresses = []string{"all"} },
		want: map[string]any{"mode": "nftables", "nodePortAddresses": []any{"all"}},
	}, {
		name: "ipvs",
		edit: func(c *v1alpha1.KubeProxyConfiguration) { c.Mode = ModeIPVS },
		want: map[string]any{
			"mode":     "ipvs",
			"iptables": map[string]any{"syncPeriod": "0s", "minSyncPeriod": "0s"},
			"ipvs":     map[string]any{"syncPeriod": "30s", "minSyncPeriod": "0s"},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			c := &v1alpha1.KubeProxyConfiguration{}
			tc.edit(c)
			Defaults(c)
			mode := c.Mode
			b, err := json.Marshal(Configz(c))
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]any
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			for k, want := range tc.want {
				g := got[k]
				if w, ok := want.(map[string]any); ok {
					sub, _ := g.(map[string]any)
					picked := map[string]any{}
					for kk := range w {
						picked[kk] = sub[kk]
					}
					g = picked
				}
				if d := cmp.Diff(want, g); d != "" {
					t.Errorf("%s (-want +got):\n%s", k, d)
				}
			}
			if c.Mode != mode {
				t.Errorf("Configz changed the configuration's mode to %q", c.Mode)
			}
		})
	}
}
