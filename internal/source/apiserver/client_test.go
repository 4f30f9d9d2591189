package apiserver

import (
	"os"
	"path/filepath"
	"testing"

	componentbaseconfigv1alpha1 "k8s.io/component-base/config/v1alpha1"
)

const testKubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:6443
    insecure-skip-tls-verify: true
contexts:
- name: ctx
  context:
    cluster: c
    user: u
current-context: ctx
users:
- name: u
  user:
    token: test-token
`

func TestRestConfig(t *testing.T) {
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, []byte(testKubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	// No in-cluster environment, whatever machine runs the test.
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")

	type cc = componentbaseconfigv1alpha1.ClientConnectionConfiguration
	tests := []struct {
		name       string
		kubeconfig string
		master     string
		cc         cc
		wantErr    bool
		wantHost   string
		wantCT     string
		wantAccept string
		wantQPS    float32
		wantBurst  int
		wantToken  string
	}{{
		name: "kubeconfig argument, upstream defaults", kubeconfig: kc,
		wantHost: "https://127.0.0.1:6443", wantCT: "application/vnd.kubernetes.protobuf", wantQPS: 5, wantBurst: 10, wantToken: "test-token",
	}, {
		name: "kubeconfig from the config", cc: cc{Kubeconfig: kc},
		wantHost: "https://127.0.0.1:6443", wantCT: "application/vnd.kubernetes.protobuf", wantQPS: 5, wantBurst: 10, wantToken: "test-token",
	}, {
		name: "master overrides the kubeconfig server", kubeconfig: kc, master: "https://127.0.0.2:8443",
		wantHost: "https://127.0.0.2:8443", wantCT: "application/vnd.kubernetes.protobuf", wantQPS: 5, wantBurst: 10, wantToken: "test-token",
	}, {
		name: "master alone", master: "http://127.0.0.1:8080",
		wantHost: "http://127.0.0.1:8080", wantCT: "application/vnd.kubernetes.protobuf", wantQPS: 5, wantBurst: 10,
	}, {
		name: "explicit connection settings", kubeconfig: kc,
		cc:       cc{ContentType: "application/json", AcceptContentTypes: "application/json", QPS: 50, Burst: 100},
		wantHost: "https://127.0.0.1:6443", wantCT: "application/json", wantAccept: "application/json", wantQPS: 50, wantBurst: 100, wantToken: "test-token",
	}, {
		name: "missing kubeconfig file", kubeconfig: filepath.Join(dir, "nope"), wantErr: true,
	}, {
		name: "nothing given and not in a cluster", wantErr: true,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := restConfig(tc.kubeconfig, tc.master, tc.cc)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("got config for %s, want an error", cfg.Host)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Host != tc.wantHost || cfg.ContentType != tc.wantCT || cfg.AcceptContentTypes != tc.wantAccept ||
				cfg.QPS != tc.wantQPS || cfg.Burst != tc.wantBurst || cfg.BearerToken != tc.wantToken {
				t.Errorf("got host=%q contentType=%q accept=%q qps=%v burst=%d token=%q", cfg.Host, cfg.ContentType, cfg.AcceptContentTypes, cfg.QPS, cfg.Burst, cfg.BearerToken)
			}
		})
	}

	// NewClient builds a clientset from the same config.
	if c, err := NewClient(kc, "", cc{}); err != nil || c == nil {
		t.Errorf("NewClient = %v, %v", c, err)
	}
}
