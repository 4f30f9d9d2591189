package ipvs

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/model"
)

// TestNewOptions: one family's options as the configuration gives them,
// and NewProxier refusing what Render cannot work with.
func TestNewOptions(t *testing.T) {
	c := config.NewOptions().Config
	c.IPVS.Scheduler = "wrr"
	c.ClusterCIDR = "198.18.128.0/17,fd00:18:1::/48"
	c.BindAddress = "198.18.0.10"
	c.IPVS.ExcludeCIDRs = []string{"198.19.99.0/24", "fd00:99::/64"}
	c.IPVS.TCPTimeout = metav1.Duration{Duration: 90 * time.Second}
	o, err := NewOptions(c, model.IPv4, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	rc := o.Config
	if rc.Scheduler != "wrr" || rc.NodeName != "node-a" || len(rc.LocalDetect.ClusterCIDRs) != 1 ||
		rc.LocalDetect.ClusterCIDRs[0] != netip.MustParsePrefix("198.18.128.0/17") || len(rc.NodeIPs) != 1 {
		t.Errorf("IPv4 render config: %+v", rc)
	}
	if err := rc.Validate(); err != nil {
		t.Error(err)
	}
	if o.Timeouts.TCP != 90 || len(o.ExcludeCIDRs) != 1 || o.ExcludeCIDRs[0] != netip.MustParsePrefix("198.19.99.0/24") {
		t.Errorf("IPv4 options: %+v", o)
	}
	o6, err := NewOptions(c, model.IPv6, "node-a")
	if rc6 := o6.Config; err != nil || len(rc6.NodeIPs) != 0 || rc6.LocalDetect.ClusterCIDRs[0].Addr().Is4() {
		t.Errorf("IPv6 render config: %+v, %v", rc6, err)
	}
	if len(o6.ExcludeCIDRs) != 1 || o6.ExcludeCIDRs[0] != netip.MustParsePrefix("fd00:99::/64") {
		t.Errorf("IPv6 excludeCIDRs: %v", o6.ExcludeCIDRs)
	}
	c.IPVS.ExcludeCIDRs = []string{"not-a-cidr"}
	if _, err := NewOptions(c, model.IPv4, "node-a"); err == nil || !strings.Contains(err.Error(), "not-a-cidr") {
		t.Errorf("a bad excludeCIDR: %v", err)
	}
	c.IPVS.ExcludeCIDRs = nil
	c.IPVS.Scheduler = "nope"
	o, err = NewOptions(c, model.IPv4, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewProxier(o, Handles{}); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("NewProxier with an unknown scheduler: %v", err)
	}
}
