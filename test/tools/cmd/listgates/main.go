// Command listgates prints every feature gate upstream kube-proxy v1.37
// registers (all Kubernetes gates, as kube-proxy links pkg/features), one a
// line: "Name default prerelease locked". --help hides GA and deprecated
// gates; test/compat needs all of them to check kproxy accepts the same set.
package main

import (
	"fmt"
	"sort"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
	metricsfeatures "k8s.io/component-base/metrics/features"
	_ "k8s.io/kubernetes/pkg/features"
)

func main() {
	// As cmd/kube-proxy/app/server.go's init does.
	if err := metricsfeatures.AddFeatureGates(utilfeature.DefaultMutableFeatureGate); err != nil {
		panic(err)
	}
	if err := logsapi.AddFeatureGates(utilfeature.DefaultMutableFeatureGate); err != nil {
		panic(err)
	}
	all := utilfeature.DefaultMutableFeatureGate.GetAll()
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, string(n))
	}
	sort.Strings(names)
	for _, n := range names {
		s := all[featuregate.Feature(n)]
		pre := string(s.PreRelease)
		if pre == "" {
			pre = "GA"
		}
		fmt.Printf("%s %t %s %t\n", n, s.Default, pre, s.LockToDefault)
	}
}
