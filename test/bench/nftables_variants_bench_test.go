package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
)

// BenchmarkNFTablesEndpointVariants times two partial syncs
// BenchmarkNFTablesEndpointChange does not: "added", one endpoint added
// to a service (its endpoint count changes), and "again", a service
// changed a second time right after a first change (untimed), within
// the clean-up delay. Plain ClusterIP ports (no chain of their own, docs/benchmarks.md)
// write a changed port into a higher tier of their maps; these are the
// cases where the count's chain is new or the port already moved up.
func BenchmarkNFTablesEndpointVariants(b *testing.B) {
	needRoot(b)
	for _, kind := range []string{"added", "again"} {
		for _, n := range sizes {
			b.Run(fmt.Sprintf("%s/services=%d", kind, n), func(b *testing.B) {
				st := state(n)
				ns := newNetns(b)
				p := newProxier(b, ns)
				if _, err := p.Sync(context.Background(), &proxy.Request{State: st, Changed: sets.New[model.ServicePortName](), Full: true, Now: time.Now()}); err != nil {
					b.Fatal(err)
				}
				// As BenchmarkNFTablesEndpointChange: let the full sync's
				// memory go back to the OS first.
				time.Sleep(time.Second)
				change := func(i int, name model.ServicePortName, add bool) {
					eps := append([]*model.Endpoint(nil), st.Endpoints[name]...)
					e := *eps[0]
					e.Port = int32(20000 + i%20000)
					if add {
						eps = append(eps, &e)
					} else {
						eps[0] = &e
					}
					st.Endpoints[name] = eps
					if _, err := p.Sync(context.Background(), &proxy.Request{State: st, Changed: sets.New(name), Now: time.Now()}); err != nil {
						b.Fatal(err)
					}
				}
				b.ResetTimer()
				for i := range b.N {
					name := spn((i * 7919) % n)
					if kind == "added" {
						change(i, name, true)
						continue
					}
					b.StopTimer()
					change(i, name, false)
					b.StartTimer()
					change(i+1, name, false)
				}
			})
		}
	}
}
