package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/server"
)

// TestZpagesWiring: /flagz (the command's flags as parsed) and /statusz
// are served when their gates are on (both are, by default, in v1.37) and
// not when a gate is turned off, as upstream.
func TestZpagesWiring(t *testing.T) {
	for _, tc := range []struct {
		name           string
		gates          map[string]bool
		flagz, statusz bool
	}{
		{name: "defaults", flagz: true, statusz: true},
		{name: "flagz off", gates: map[string]bool{"ComponentFlagz": false}, statusz: true},
		{name: "statusz off", gates: map[string]bool{"ComponentStatusz": false}, flagz: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gates, err := config.NewFeatureGate(&v1alpha1.KubeProxyConfiguration{FeatureGates: tc.gates})
			if err != nil {
				t.Fatal(err)
			}
			cmd := newRootCommand()
			if err := cmd.Flags().Parse([]string{"--proxy-mode=nftables", "--cluster-cidr=198.18.0.0/16"}); err != nil {
				t.Fatal(err)
			}
			h := server.NewMetricsServer(withZpages(server.MetricsServerConfig{}, gates, cmd.Flags())).Handler()
			serve := func(path string) (int, string) {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
				return rec.Code, rec.Body.String()
			}

			code, body := serve("/flagz")
			if tc.flagz {
				if code != http.StatusOK || !strings.Contains(body, "\nproxy-mode") || !strings.Contains(body, "198.18.0.0/16\n") || !strings.Contains(body, "\nkubeconfig") {
					t.Errorf("/flagz: code %d, body:\n%s", code, body)
				}
			} else if code != http.StatusNotFound {
				t.Errorf("/flagz with the gate off: code %d, want 404", code)
			}

			code, body = serve("/statusz")
			if tc.statusz {
				if code != http.StatusOK || !strings.Contains(body, version) || !strings.Contains(body, config.KubernetesVersion) {
					t.Errorf("/statusz: code %d, body:\n%s", code, body)
				}
			} else if code != http.StatusNotFound {
				t.Errorf("/statusz with the gate off: code %d, want 404", code)
			}
		})
	}
}

func TestFlagzValuesClassified(t *testing.T) {
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	fs.String("token", "", "")
	fs.String("mode", "", "")
	if err := fs.SetAnnotation("token", "classified", []string{"true"}); err != nil {
		t.Fatal(err)
	}
	if err := fs.Parse([]string{"--token=s3cret", "--mode=iptables"}); err != nil {
		t.Fatal(err)
	}
	got := flagzValues(fs)()
	if got["token"] != "CLASSIFIED" || got["mode"] != "iptables" {
		t.Errorf("flagz values = %v", got)
	}
}
