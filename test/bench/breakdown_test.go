package bench

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/nftables"
)

func renderFull(st *model.State) *nftables.Plan {
	cfg := (&nftables.Options{Family: model.IPv4, ModeOptions: config.ModeOptions{MasqueradeBit: 14}}).RenderConfig(nil, nil)
	return nftables.Render(cfg, &nftables.Input{RenderInput: proxy.RenderInput{State: st, Changed: sets.New[model.ServicePortName]()}, Full: true, Now: time.Now()}, nftables.NewApplied())
}

// BenchmarkNFTablesRender: the pure part of a full sync (no root needed).
func BenchmarkNFTablesRender(b *testing.B) {
	for _, n := range sizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			st := state(n)
			b.ResetTimer()
			var ops int
			for range b.N {
				ops = renderFull(st).Tx.Len()
			}
			b.ReportMetric(float64(ops), "ops")
		})
	}
}

// BenchmarkNFTablesApplyText applies the same full sync with `nft -f`, for
// comparison with the netlink path (BenchmarkNFTablesFullSync).
func BenchmarkNFTablesApplyText(b *testing.B) {
	needRoot(b)
	if _, err := exec.LookPath("nft"); err != nil {
		b.Skip("needs nft")
	}
	for _, n := range sizes[:2] {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			text := renderFull(state(n)).Tx.String()
			b.SetBytes(int64(len(text)))
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				ns := newNetns(b)
				cmd := exec.CommandContext(context.Background(), "ip", "netns", "exec", ns, "nft", "-f", "-")
				cmd.Stdin = strings.NewReader(text)
				b.StartTimer()
				if out, err := cmd.CombinedOutput(); err != nil {
					b.Fatalf("nft -f: %v: %s", err, out)
				}
			}
		})
	}
}
