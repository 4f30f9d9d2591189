package config

// FuzzLoadConfigFile: whatever bytes the config file holds, the loader
// neither panics nor hangs; it returns a configuration or an error that
// says what is wrong with the file (never an empty message), and a
// configuration it returns goes through Defaults and Validate without
// panicking (Validate's error, if any, is not empty either). Seeds: the
// cases of file_test.go and the go-fuzz corpus in
// testdata/fuzz/FuzzLoadConfigFile.

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func FuzzLoadConfigFile(f *testing.F) {
	for _, s := range []string{
		header,
		header + "mode: nftables\nclusterCIDR: 198.18.128.0/17\n",
		header + "bindAddress: 0.0.0.0\nclientConnection:\n  kubeconfig: /k\n  qps: 0\niptables:\n  masqueradeBit: null\n  syncPeriod: 0s\nmode: \"ipvs\"\n",
		header + "mode: nftables\nmode: iptables\n",
		header + "unknownField: 1\nconntrack:\n  maxPerCore: -1\n",
		header + "nodePortAddresses: [\"198.18.0.0/24\", \"primary\", \"not-a-cidr\"]\n",
		header + "syncPeriod: -1s\nmetricsBindAddress: \"[::1]:99999\"\n",
		header + "featureGates:\n  NoSuchGate: true\n  AllAlpha: false\n",
		"apiVersion: v1\nkind: Service\n",
		`{"apiVersion":"kubeproxy.config.k8s.io/v1alpha1","kind":"KubeProxyConfiguration","mode":"nftables"}`,
		"", "---\n", "\x00\xff", "a: &a [*a, *a]\n", "{", "[1, 2]",
		header + "iptables: 3\n",
		header + "detectLocalMode: InterfaceNamePrefix\ndetectLocal:\n  interfaceNamePrefix: \"\\\"; rm -rf /\"\n",
	} {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	path := filepath.Join(dir, "config.conf")
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := LoadConfigFile(path)
		if err != nil {
			if c != nil {
				t.Errorf("an error (%v) and a configuration", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, "config file "+path) && !strings.Contains(msg, "reading kube-proxy config file") {
				t.Errorf("the error does not name the file: %q", msg)
			}
			if strings.TrimSpace(strings.TrimPrefix(msg, "config file "+path+":")) == "" {
				t.Errorf("the error says nothing: %q", msg)
			}
			return
		}
		if c == nil {
			t.Fatal("no configuration and no error")
		}
		Defaults(c)
		if err := Validate(c); err != nil && strings.TrimSpace(err.Error()) == "" {
			t.Errorf("Validate returns an empty error")
		}
	})
}
