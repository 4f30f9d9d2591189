package conntrack

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kube-proxy/config/v1alpha1"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/internal/kernel/sysctl/sysctltest"
)

// kernelDefaults are a fresh kernel's values (nf_conntrack_max and the
// hash size as on a small machine).
func kernelDefaults() map[string]int {
	return map[string]int{
		MaxPath:                   65536,
		HashsizePath:              16384,
		TCPEstablishedTimeoutPath: 432000,
		TCPCloseWaitTimeoutPath:   60,
		TCPBeLiberalPath:          0,
		UDPTimeoutPath:            30,
		UDPStreamTimeoutPath:      120,
	}
}

// kubeadm is the conntrack section kubeadm's ConfigMap leaves defaulted.
func kubeadm() *v1alpha1.KubeProxyConntrackConfiguration {
	return &v1alpha1.KubeProxyConntrackConfiguration{
		MaxPerCore:            ptr.To[int32](32768),
		Min:                   ptr.To[int32](131072),
		TCPEstablishedTimeout: &metav1.Duration{Duration: 24 * time.Hour},
		TCPCloseWaitTimeout:   &metav1.Duration{Duration: time.Hour},
	}
}

func TestSetSysctls(t *testing.T) {
	tests := []struct {
		name   string
		conf   func(*v1alpha1.KubeProxyConntrackConfiguration)
		cpus   int
		kernel func(map[string]int)
		want   func(map[string]int)
		writes []string
	}{{
		name: "kubeadm defaults on 2 CPUs: min wins, hash grown, TCP timeouts set",
		cpus: 2,
		want: func(m map[string]int) {
			m[MaxPath], m[HashsizePath] = 131072, 32768
			m[TCPEstablishedTimeoutPath], m[TCPCloseWaitTimeoutPath] = 86400, 3600
		},
		writes: []string{MaxPath + "=131072", HashsizePath + "=32768", TCPEstablishedTimeoutPath + "=86400", TCPCloseWaitTimeoutPath + "=3600"},
	}, {
		name: "8 CPUs: maxPerCore × CPUs above min",
		cpus: 8,
		want: func(m map[string]int) {
			m[MaxPath], m[HashsizePath] = 262144, 65536
			m[TCPEstablishedTimeoutPath], m[TCPCloseWaitTimeoutPath] = 86400, 3600
		},
		writes: []string{MaxPath + "=262144", HashsizePath + "=65536", TCPEstablishedTimeoutPath + "=86400", TCPCloseWaitTimeoutPath + "=3600"},
	}, {
		name: "128 CPUs: capped at 2^20",
		cpus: 128,
		want: func(m map[string]int) {
			m[MaxPath], m[HashsizePath] = 1048576, 262144
			m[TCPEstablishedTimeoutPath], m[TCPCloseWaitTimeoutPath] = 86400, 3600
		},
		writes: []string{MaxPath + "=1048576", HashsizePath + "=262144", TCPEstablishedTimeoutPath + "=86400", TCPCloseWaitTimeoutPath + "=3600"},
	}, {
		name:   "max never lowered, hash never shrunk, equal values not rewritten",
		cpus:   2,
		kernel: func(m map[string]int) { m[MaxPath], m[HashsizePath], m[TCPCloseWaitTimeoutPath] = 500000, 200000, 3600 },
		want: func(m map[string]int) {
			m[MaxPath], m[HashsizePath] = 500000, 200000
			m[TCPEstablishedTimeoutPath], m[TCPCloseWaitTimeoutPath] = 86400, 3600
		},
		writes: []string{TCPEstablishedTimeoutPath + "=86400"},
	}, {
		name:   "max already large, hash small: only the hash grows",
		cpus:   2,
		kernel: func(m map[string]int) { m[MaxPath] = 131072 },
		want: func(m map[string]int) {
			m[MaxPath], m[HashsizePath] = 131072, 32768
			m[TCPEstablishedTimeoutPath], m[TCPCloseWaitTimeoutPath] = 86400, 3600
		},
		writes: []string{HashsizePath + "=32768", TCPEstablishedTimeoutPath + "=86400", TCPCloseWaitTimeoutPath + "=3600"},
	}, {
		name: "zero everywhere leaves everything as it is",
		cpus: 2,
		conf: func(c *v1alpha1.KubeProxyConntrackConfiguration) {
			*c = v1alpha1.KubeProxyConntrackConfiguration{
				MaxPerCore: ptr.To[int32](0), Min: ptr.To[int32](131072),
				TCPEstablishedTimeout: &metav1.Duration{}, TCPCloseWaitTimeout: &metav1.Duration{},
			}
		},
		want: func(map[string]int) {},
	}, {
		name: "explicit values: be liberal and both UDP timeouts",
		cpus: 2,
		conf: func(c *v1alpha1.KubeProxyConntrackConfiguration) {
			c.MaxPerCore = ptr.To[int32](0)
			c.TCPEstablishedTimeout.Duration = 2 * time.Hour
			c.TCPCloseWaitTimeout.Duration = 90 * time.Second
			c.TCPBeLiberal = true
			c.UDPTimeout.Duration = 45 * time.Second
			c.UDPStreamTimeout.Duration = 3 * time.Minute
		},
		want: func(m map[string]int) {
			m[TCPEstablishedTimeoutPath], m[TCPCloseWaitTimeoutPath], m[TCPBeLiberalPath] = 7200, 90, 1
			m[UDPTimeoutPath], m[UDPStreamTimeoutPath] = 45, 180
		},
		writes: []string{TCPEstablishedTimeoutPath + "=7200", TCPCloseWaitTimeoutPath + "=90", TCPBeLiberalPath + "=1", UDPTimeoutPath + "=45", UDPStreamTimeoutPath + "=180"},
	}, {
		name: "min alone without maxPerCore does nothing",
		cpus: 2,
		conf: func(c *v1alpha1.KubeProxyConntrackConfiguration) {
			c.MaxPerCore = nil
			c.Min = ptr.To[int32](1 << 20)
			c.TCPEstablishedTimeout, c.TCPCloseWaitTimeout = nil, nil
		},
		want: func(map[string]int) {},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conf := kubeadm()
			if tt.conf != nil {
				tt.conf(conf)
			}
			kernel := kernelDefaults()
			if tt.kernel != nil {
				tt.kernel(kernel)
			}
			fake := sysctltest.New(kernel)
			if err := SetSysctls(context.Background(), fake, conf, tt.cpus); err != nil {
				t.Fatalf("SetSysctls: %v", err)
			}
			want := sysctltest.New(kernel)
			tt.want(want.Values)
			if d := cmp.Diff(want.Dump(), fake.Dump()); d != "" {
				t.Errorf("values (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tt.writes, fake.Writes); d != "" {
				t.Errorf("writes (-want +got):\n%s", d)
			}
		})
	}
}

// In a network namespace other than the initial one nf_conntrack_max is
// read-only: raising it fails there, with the reason, as upstream.
func TestSetSysctlsReadOnlyMax(t *testing.T) {
	fake := sysctltest.New(kernelDefaults())
	fake.ReadOnly[MaxPath] = true
	err := SetSysctls(context.Background(), fake, kubeadm(), 2)
	if !errors.Is(err, fs.ErrPermission) || !strings.Contains(err.Error(), "nf_conntrack_max") {
		t.Fatalf("got %v, want a permission error naming nf_conntrack_max", err)
	}
}

// Without the nf_conntrack module the hash size cannot be read: an error.
func TestSetSysctlsNoModule(t *testing.T) {
	k := kernelDefaults()
	delete(k, HashsizePath)
	err := SetSysctls(context.Background(), sysctltest.New(k), kubeadm(), 2)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("got %v, want a not-exist error", err)
	}
}
