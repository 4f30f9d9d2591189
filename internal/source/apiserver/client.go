package apiserver

import (
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	componentbaseconfigv1alpha1 "k8s.io/component-base/config/v1alpha1"
	"k8s.io/klog/v2"
)

// Upstream kube-proxy's defaults for clientConnection
// (pkg/proxy/apis/config/v1alpha1/defaults.go). They are applied here too,
// for zero fields, so that a caller that did not default its config still
// gets upstream's behaviour.
const (
	defaultContentType = "application/vnd.kubernetes.protobuf"
	defaultQPS         = 5
	defaultBurst       = 10
)

// NewClient returns a clientset configured as upstream kube-proxy's:
// kubeconfig (or, when empty, cc.Kubeconfig) is a kubeconfig file; master,
// when set, overrides its server URL; with neither, the in-cluster config
// (service account token and KUBERNETES_SERVICE_HOST/PORT) is used.
// qps, burst, contentType and acceptContentTypes come from cc; contentType
// defaults to protobuf, qps to 5 and burst to 10, as upstream.
func NewClient(kubeconfig, master string, cc componentbaseconfigv1alpha1.ClientConnectionConfiguration) (kubernetes.Interface, error) {
	cfg, err := restConfig(kubeconfig, master, cc)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating API client: %w", err)
	}
	return client, nil
}

func restConfig(kubeconfig, master string, cc componentbaseconfigv1alpha1.ClientConnectionConfiguration) (*rest.Config, error) {
	if kubeconfig == "" {
		kubeconfig = cc.Kubeconfig
	}
	var cfg *rest.Config
	var err error
	if kubeconfig == "" && master == "" {
		klog.InfoS("Neither kubeconfig file nor master URL was specified, using the in-cluster config")
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster API config: %w", err)
		}
	} else {
		// ExplicitPath alone: no KUBECONFIG or ~/.kube/config merging, so
		// that a daemon's connection does not depend on its environment.
		cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig},
			&clientcmd.ConfigOverrides{ClusterInfo: clientcmdapi.Cluster{Server: master}},
		).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("API config from kubeconfig %q, master %q: %w", kubeconfig, master, err)
		}
	}
	cfg.AcceptContentTypes = cc.AcceptContentTypes
	cfg.ContentType = cc.ContentType
	if cfg.ContentType == "" {
		cfg.ContentType = defaultContentType
	}
	cfg.QPS = cc.QPS
	if cfg.QPS == 0 {
		cfg.QPS = defaultQPS
	}
	cfg.Burst = int(cc.Burst)
	if cfg.Burst == 0 {
		cfg.Burst = defaultBurst
	}
	return cfg, nil
}
