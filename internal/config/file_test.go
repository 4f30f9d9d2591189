package config

// Addresses: 10.244.0.0/16 and fd00:1::/64 stand for pod ranges,
// 192.0.2.0/24 (TEST-NET-1) for node addresses. Files live in t.TempDir().

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/kube-proxy/config/v1alpha1"
)

const header = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"

func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.conf")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoadConfigFile(t *testing.T) {
	cases := []struct {
		name    string
		content string
		check   func(*v1alpha1.KubeProxyConfiguration) bool
	}{
		{
			// What kubeadm writes, with explicit zero values everywhere.
			name: "kubeadm yaml",
			content: header + `bindAddress: 0.0.0.0
clientConnection:
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 10.244.0.0/16
conntrack:
  maxPerCore: null
iptables:
  masqueradeBit: null
  syncPeriod: 0s
mode: "ipvs"
ipvs:
  scheduler: "wrr"
  excludeCIDRs: ["192.0.2.0/24"]
nodePortAddresses: null
`,
			check: func(c *v1alpha1.KubeProxyConfiguration) bool {
				return c.ClientConnection.Kubeconfig == "/var/lib/kube-proxy/kubeconfig.conf" && c.ClusterCIDR == "10.244.0.0/16" &&
					c.Mode == "ipvs" && c.IPVS.Scheduler == "wrr" && slices.Equal(c.IPVS.ExcludeCIDRs, []string{"192.0.2.0/24"}) &&
					c.Conntrack.MaxPerCore == nil && c.IPTables.MasqueradeBit == nil
			},
		},
		{
			name:    "json",
			content: `{"apiVersion":"kubeproxy.config.k8s.io/v1alpha1","kind":"KubeProxyConfiguration","mode":"nftables","nftables":{"masqueradeBit":5,"syncPeriod":"1m"},"featureGates":{"NFTablesNetlink":false}}`,
			check: func(c *v1alpha1.KubeProxyConfiguration) bool {
				return c.Mode == "nftables" && *c.NFTables.MasqueradeBit == 5 && c.NFTables.SyncPeriod.Duration == time.Minute &&
					!c.FeatureGates["NFTablesNetlink"]
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := LoadConfigFile(writeFile(t, tc.content))
			if err != nil {
				t.Fatalf("LoadConfigFile: %v", err)
			}
			if !tc.check(c) {
				t.Errorf("unexpected config: %+v", c)
			}
		})
	}
}

func TestLoadConfigFileErrors(t *testing.T) {
	cases := []struct {
		name    string
		content string
		want    []string
	}{
		{name: "wrong kind", content: "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n", want: []string{`kind is "KubeletConfiguration", must be "KubeProxyConfiguration"`}},
		{name: "wrong apiVersion", content: "apiVersion: kubeproxy.config.k8s.io/v1alpha2\nkind: KubeProxyConfiguration\n", want: []string{`apiVersion is "kubeproxy.config.k8s.io/v1alpha2", must be "kubeproxy.config.k8s.io/v1alpha1"`}},
		{name: "no type at all", content: "mode: iptables\n", want: []string{`apiVersion is ""`, `kind is ""`}},
		{name: "empty file", content: "", want: []string{`apiVersion is ""`, `kind is ""`}},
		{name: "not yaml", content: header + "bindAddress: ::\n", want: []string{"not valid YAML or JSON"}},
		{name: "not an object", content: "- a\n- b\n", want: []string{"not a KubeProxyConfiguration object"}},
		{name: "wrong value type", content: header + "iptables:\n  masqueradeBit: fourteen\n", want: []string{"decoding"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, tc.content)
			_, err := LoadConfigFile(path)
			if err == nil {
				t.Fatal("LoadConfigFile succeeded, want an error")
			}
			for _, w := range append(tc.want, path) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}

	_, err := LoadConfigFile(filepath.Join(t.TempDir(), "missing.conf"))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: error %v is not fs.ErrNotExist", err)
	}
}

// Upstream decodes v1alpha1 leniently when strict decoding fails; kproxy
// does the same and names every offending field.
func TestDecodeUnknownAndDuplicateFields(t *testing.T) {
	content := header + `mode: nftables
foo: 1
BindAddress: 192.0.2.1
iptables:
  masqueradeBit: 3
  bogus: true
conntrack:
  max: 100
mode: iptables
`
	c, strictErrs, err := decodeConfig([]byte(content))
	if err != nil {
		t.Fatalf("decodeConfig: %v", err)
	}
	got := strictErrorFields(strictErrs)
	slices.Sort(got)
	want := []string{"BindAddress", "conntrack.max", "foo", "iptables.bogus", "mode"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("strict error fields (-want +got):\n%s\nerrors: %v", diff, strictErrs)
	}
	// Known fields are still decoded, the last duplicate wins, and field
	// names are case-sensitive (BindAddress is not bindAddress).
	if *c.IPTables.MasqueradeBit != 3 || c.Mode != "iptables" || c.BindAddress != "" {
		t.Errorf("lenient decode: masqueradeBit=%d mode=%q bindAddress=%q", *c.IPTables.MasqueradeBit, c.Mode, c.BindAddress)
	}
}

// A config file with many mistakes gets all of them reported at once.
func TestConfigFileWithSeveralErrors(t *testing.T) {
	path := writeFile(t, header+`mode: ipvs
bindAddress: 192.0.2.1:80
healthzBindAddress: 0.0.0.0:99999
clusterCIDR: 10.244.0.0/16,10.0.0.0/8
iptables:
  masqueradeBit: 40
ipvs:
  scheduler: fastest
  syncPeriod: 5s
  minSyncPeriod: 10s
  excludeCIDRs: [192.0.2.0/24, 192.0.2.300/24]
conntrack:
  min: -5
oomScoreAdj: -2000
nodePortAddresses: [primary, every]
featureGates:
  NotAGate: true
logging:
  format: xml
`)
	o := NewOptions()
	o.ConfigFile = path
	if err := o.Complete(newFlagSet(o), noEnv); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	err := o.Validate()
	if err == nil {
		t.Fatal("Validate accepted a broken config")
	}
	got := errorFields(t, err)
	want := []string{"bindAddress", "healthzBindAddress", "clusterCIDR", "iptables.masqueradeBit", "ipvs.scheduler",
		"ipvs.syncPeriod", "ipvs.excludeCIDRs[1]", "conntrack.min", "oomScoreAdj", "nodePortAddresses[1]", "featureGates", "logging.format"}
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("no error for %s; got %v", w, got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("got %d errors %v, want %d", len(got), got, len(want))
	}
	// The message carries each bad value.
	for _, v := range []string{"192.0.2.1:80", "99999", "fastest", "192.0.2.300/24", "-2000", "every", "NotAGate", "xml"} {
		if !strings.Contains(err.Error(), v) {
			t.Errorf("error message does not mention %q:\n%v", v, err)
		}
	}
}

func TestWriteConfigRoundTrip(t *testing.T) {
	c := validConfig(func(c *v1alpha1.KubeProxyConfiguration) {
		c.Mode = "nftables"
		c.ClusterCIDR = "10.244.0.0/16,fd00:1::/64"
		c.NodePortAddresses = []string{"primary", "localhost"}
		c.FeatureGates["KubeProxyNFTablesLocalhostNodePorts"] = true
	})
	var buf bytes.Buffer
	if err := WriteConfig(&buf, c); err != nil {
		t.Fatal(err)
	}
	back, strictErrs, err := decodeConfig(buf.Bytes())
	if err != nil || len(strictErrs) > 0 {
		t.Fatalf("written config does not decode cleanly: %v %v\n%s", err, strictErrs, buf.String())
	}
	Defaults(back)
	if diff := cmp.Diff(c, back); diff != "" {
		t.Errorf("round trip changed the config (-want +got):\n%s", diff)
	}
}
