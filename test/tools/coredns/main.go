// Command coredns is CoreDNS with the plugins a test cluster's DNS needs
// and nothing else (no cloud DNS back-ends, whose SDKs are most of
// CoreDNS's build): the test cluster (test/cluster) runs it as its cluster
// DNS, registry.k8s.io/coredns/coredns in the node images
// (test/tools/images.sh), because upstream's Services tests reach services
// by name. A module of its own so CoreDNS's dependency versions never meet
// k8s.io/kubernetes's in test/tools.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/template"
	_ "github.com/coredns/coredns/plugin/whoami"
)

// directives are the plugins above in CoreDNS's own order (its
// plugin.cfg), which is the order a query passes them.
var directives = []string{
	"reload",
	"ready",
	"health",
	"prometheus",
	"errors",
	"log",
	"loadbalance",
	"cache",
	"template",
	"hosts",
	"kubernetes",
	"loop",
	"whoami",
}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
