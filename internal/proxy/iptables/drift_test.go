package iptables

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
)

func driftString(ds []proxy.Drift) string {
	var s []string
	for _, d := range ds {
		s = append(s, d.String())
	}
	return strings.Join(s, "; ")
}

// TestCheckDrift: after full and partial syncs the kernel matches what
// kproxy wrote; each change made behind its back is found and named, once,
// and the full sync after it repairs it.
func TestCheckDrift(t *testing.T) {
	c := loadExample(t, "node-a")
	web := spName("web-clusterip", "http", model.TCP)
	for _, b := range []xtables.Backend{xtables.Legacy, xtables.NFT} {
		t.Run(string(b), func(t *testing.T) {
			r := newRig(t, c, model.IPv4, b, nil)
			ctx := context.Background()
			check := func(step string) string {
				t.Helper()
				ds, err := r.p.CheckDrift(ctx)
				if err != nil {
					t.Fatalf("%s: CheckDrift: %v", step, err)
				}
				return driftString(ds)
			}
			if got := check("before the first sync"); got != "" {
				t.Errorf("before the first sync: %s", got)
			}
			r.mustSync(true)
			if got := check("after a full sync"); got != "" {
				t.Fatalf("after a full sync: %s", got)
			}
			r.set(web, r.state.Services[web], r.state.Endpoints[web][:1])
			r.mustSync(false)
			if got := check("after a partial sync"); got != "" {
				t.Fatalf("after a partial sync: %s", got)
			}
			svcChain := ""
			for _, l := range strings.Split(r.fake.Dump(), "\n") {
				if strings.HasPrefix(l, "-A KUBE-SVC-") && strings.Contains(l, "demo/web-clusterip:http") {
					svcChain = strings.Fields(l)[1]
					break
				}
			}
			for _, tc := range []struct {
				name, restore, want string
			}{
				{"flush KUBE-SERVICES", "*nat\n-F KUBE-SERVICES\nCOMMIT\n", "chain nat/KUBE-SERVICES flushed"},
				{"delete the PREROUTING jump", "*nat\n-D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\nCOMMIT\n", "rule nat/PREROUTING jump to KUBE-SERVICES deleted"},
				{"delete a KUBE-SVC rule", "*nat\n-D " + svcChain + " 1\nCOMMIT\n", "rule nat/" + svcChain + " 1 deleted"},
				{"add a rule", "*filter\n-A KUBE-FORWARD -j ACCEPT\nCOMMIT\n", "rule filter/KUBE-FORWARD 1 added"},
				{"delete the canary", "*mangle\n-X KUBE-PROXY-CANARY\nCOMMIT\n", "chain mangle/KUBE-PROXY-CANARY deleted"},
			} {
				if err := r.fake.Restore(ctx, []byte(tc.restore), xtables.RestoreOptions{NoFlush: true}); err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
				if got := check(tc.name); !strings.HasPrefix(got, tc.want) {
					t.Errorf("%s: drift %q, want it to start with %q", tc.name, got, tc.want)
				}
				if got := check(tc.name + ", again"); got != "" {
					t.Errorf("%s: reported twice: %s", tc.name, got)
				}
				// The repair's full sync does not report it again.
				before := testutil.ToFloat64(metrics.RulesDriftTotal.WithLabelValues("iptables", "chain")) + testutil.ToFloat64(metrics.RulesDriftTotal.WithLabelValues("iptables", "rule"))
				r.mustSync(true)
				after := testutil.ToFloat64(metrics.RulesDriftTotal.WithLabelValues("iptables", "chain")) + testutil.ToFloat64(metrics.RulesDriftTotal.WithLabelValues("iptables", "rule"))
				if after != before {
					t.Errorf("%s: the repair counted drift again (%v -> %v)", tc.name, before, after)
				}
				if got := check(tc.name + ", repaired"); got != "" {
					t.Errorf("%s: after the repair: %s", tc.name, got)
				}
			}
			// Found by the full sync itself when no check ran before it.
			if err := r.fake.Restore(ctx, []byte("*nat\n-F KUBE-SERVICES\nCOMMIT\n"), xtables.RestoreOptions{NoFlush: true}); err != nil {
				t.Fatal(err)
			}
			before := testutil.ToFloat64(metrics.RulesDriftTotal.WithLabelValues("iptables", "chain"))
			r.mustSync(true)
			if after := testutil.ToFloat64(metrics.RulesDriftTotal.WithLabelValues("iptables", "chain")); after != before+1 {
				t.Errorf("a full sync after a flush counted %v drift, want 1", after-before)
			}
		})
	}
}
