package bench

// iptables mode against the real iptables-restore of both backends, in a
// network namespace per benchmark (the same synthetic cluster as the
// nftables benchmarks: N ClusterIP services × 10 endpoints, IPv4).
//
// Run (as root):
//
//	go test ./test/bench -run '^$' -bench 'IPTables' -benchtime 3x -timeout 60m
//
// Each sync reports restore-bytes (the input handed to iptables-restore),
// restores (runs of it), and where the time went: restore-ms inside
// iptables-restore (tool and kernel), save-ms inside iptables-save (the
// kernel read before full syncs, the canary check before partial ones),
// and other-ms, the rest (rendering and bookkeeping in kproxy).

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/iptables"
	"github.com/kproxy/kproxy/internal/proxy/localdetect"
)

var iptablesSizes = []int{1000, 10000}

// timedIPT measures the time spent in iptables-save and iptables-restore.
type timedIPT struct {
	xtables.Interface
	save, restore time.Duration
	bytes, runs   int
}

func (t *timedIPT) Save(ctx context.Context, table string) ([]byte, error) {
	start := time.Now()
	defer func() { t.save += time.Since(start) }()
	return t.Interface.Save(ctx, table)
}

func (t *timedIPT) RestoreWithStats(ctx context.Context, data []byte, opts xtables.RestoreOptions) (xtables.RestoreStats, error) {
	start := time.Now()
	defer func() { t.restore += time.Since(start) }()
	t.bytes += len(data)
	t.runs++
	return t.Interface.RestoreWithStats(ctx, data, opts)
}

func (t *timedIPT) Restore(ctx context.Context, data []byte, opts xtables.RestoreOptions) error {
	_, err := t.RestoreWithStats(ctx, data, opts)
	return err
}

func (t *timedIPT) reset() { t.save, t.restore, t.bytes, t.runs = 0, 0, 0, 0 }

// newIPTables returns the backend's tools acting in namespace ns.
func newIPTables(b *testing.B, backend xtables.Backend, ns string) *timedIPT {
	b.Helper()
	if _, err := exec.LookPath("nsenter"); err != nil {
		b.Skip("needs nsenter")
	}
	// nsenter --net is lighter than `ip netns exec` (no mount namespace):
	// ~3 ms per run instead of ~5, closer to a proxier on the host.
	ipt, err := xtables.New(backend, xtables.IPv4, xtables.WithCommandPrefix("nsenter", "--net=/run/netns/"+ns))
	if errors.Is(err, xtables.ErrNotInstalled) {
		b.Skip(err)
	}
	if err != nil {
		b.Fatal(err)
	}
	return &timedIPT{Interface: ipt}
}

// layouts are upstream's chain layout and the compact one (no KUBE-SEP
// chains, iptables.Options.CompactLayout).
var layouts = []bool{false, true}

func layoutName(compact bool) string {
	if compact {
		return "compact"
	}
	return "upstream"
}

func iptablesOptions(compact bool) iptables.Options {
	return iptables.Options{
		CompactLayout: compact,
		Family:        model.IPv4, Hostname: "node-a", LocalhostNodePorts: true,
		ModeOptions: config.ModeOptions{
			MasqueradeBit: 14,
			LocalDetect:   localdetect.Config{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/16")}},
			NodeIPs:       []netip.Addr{netip.MustParseAddr("198.17.0.10")},
		},
	}
}

func (t *timedIPT) report(b *testing.B, total time.Duration, n int) {
	b.ReportMetric(float64(t.bytes)/float64(n), "restore-bytes")
	b.ReportMetric(float64(t.runs)/float64(n), "restores")
	b.ReportMetric(float64(t.restore.Milliseconds())/float64(n), "restore-ms")
	b.ReportMetric(float64(t.save.Milliseconds())/float64(n), "save-ms")
	b.ReportMetric(float64((total-t.restore-t.save).Milliseconds())/float64(n), "other-ms")
}

// BenchmarkIPTablesFullSync: the first sync of a node into an empty
// namespace: kernel read, render, restore(s).
func BenchmarkIPTablesFullSync(b *testing.B) {
	needRoot(b)
	for _, backend := range xtables.Backends {
		for _, compact := range layouts {
			for _, n := range iptablesSizes {
				b.Run(fmt.Sprintf("backend=%s/layout=%s/services=%d", backend, layoutName(compact), n), func(b *testing.B) {
					st := state(n)
					var total time.Duration
					var ipt *timedIPT
					acc := &timedIPT{}
					for range b.N {
						ns := newNetns(b)
						ipt = newIPTables(b, backend, ns)
						p, err := iptables.NewProxier(iptablesOptions(compact), iptables.Handles{IPTables: ipt})
						if err != nil {
							b.Fatal(err)
						}
						start := time.Now()
						if _, err := p.Sync(context.Background(), &proxy.Request{State: st, Changed: sets.New[model.ServicePortName](), Full: true, Now: time.Now()}); err != nil {
							b.Fatal(err)
						}
						total += time.Since(start)
						acc.save += ipt.save
						acc.restore += ipt.restore
						acc.bytes += ipt.bytes
						acc.runs += ipt.runs
					}
					acc.report(b, total, b.N)
				})
			}
		}
	}
}

// BenchmarkIPTablesBareRestore: the same bytes a full sync restores, fed
// to iptables-restore --noflush directly (one run per restore), into an
// empty namespace: the floor that the full sync is compared with.
func BenchmarkIPTablesBareRestore(b *testing.B) {
	needRoot(b)
	for _, backend := range xtables.Backends {
		for _, compact := range layouts {
			for _, n := range iptablesSizes {
				b.Run(fmt.Sprintf("backend=%s/layout=%s/services=%d", backend, layoutName(compact), n), func(b *testing.B) {
					cfg := iptablesOptions(compact)
					cfg.MaxChainsPerRestore = -1
					if backend == xtables.NFT {
						cfg.MaxChainsPerRestore = iptables.DefaultMaxChainsPerRestore
					}
					plan := iptables.Render(cfg.RenderConfig(nil, nil), &iptables.Input{RenderInput: proxy.RenderInput{State: state(n), Changed: sets.New[model.ServicePortName]()}, Full: true, Existing: &iptables.Existing{}}, iptables.NewApplied())
					size := 0
					for _, r := range plan.Restores {
						size += len(r)
					}
					b.SetBytes(int64(size))
					b.ResetTimer()
					for range b.N {
						b.StopTimer()
						ns := newNetns(b)
						b.StartTimer()
						for _, r := range plan.Restores {
							cmd := exec.Command("nsenter", "--net=/run/netns/"+ns, "iptables-"+string(backend)+"-restore", "--noflush")
							cmd.Stdin = strings.NewReader(string(r))
							if out, err := cmd.CombinedOutput(); err != nil {
								b.Fatalf("%v: %s", err, out)
							}
						}
					}
					b.ReportMetric(float64(len(plan.Restores)), "restores")
				})
			}
		}
	}
}

// BenchmarkIPTablesEndpointChange: one endpoint of one service replaced,
// then a partial sync, with N services programmed.
func BenchmarkIPTablesEndpointChange(b *testing.B) {
	needRoot(b)
	for _, backend := range xtables.Backends {
		for _, compact := range layouts {
			for _, n := range iptablesSizes {
				b.Run(fmt.Sprintf("backend=%s/layout=%s/services=%d", backend, layoutName(compact), n), func(b *testing.B) {
					st := state(n)
					ns := newNetns(b)
					ipt := newIPTables(b, backend, ns)
					p, err := iptables.NewProxier(iptablesOptions(compact), iptables.Handles{IPTables: ipt})
					if err != nil {
						b.Fatal(err)
					}
					if _, err := p.Sync(context.Background(), &proxy.Request{State: st, Changed: sets.New[model.ServicePortName](), Full: true, Now: time.Now()}); err != nil {
						b.Fatal(err)
					}
					ipt.reset()
					b.ResetTimer()
					start := time.Now()
					for i := range b.N {
						name := spn((i * 7919) % n)
						eps := append([]*model.Endpoint(nil), st.Endpoints[name]...)
						e := *eps[0]
						e.Port = int32(20000 + i%20000)
						eps[0] = &e
						st.Endpoints[name] = eps
						if _, err := p.Sync(context.Background(), &proxy.Request{State: st, Changed: sets.New(name), Now: time.Now()}); err != nil {
							b.Fatal(err)
						}
					}
					ipt.report(b, time.Since(start), b.N)
				})
			}
		}
	}
}

// BenchmarkIPTablesRender: the pure part of a full sync (no root needed).
func BenchmarkIPTablesRender(b *testing.B) {
	for _, n := range iptablesSizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			st := state(n)
			cfg := iptablesOptions(false)
			b.ResetTimer()
			size := 0
			for range b.N {
				plan := iptables.Render(cfg.RenderConfig(nil, nil), &iptables.Input{RenderInput: proxy.RenderInput{State: st, Changed: sets.New[model.ServicePortName]()}, Full: true, Existing: &iptables.Existing{}}, iptables.NewApplied())
				size = 0
				for _, r := range plan.Restores {
					size += len(r)
				}
			}
			b.ReportMetric(float64(size), "restore-bytes")
		})
	}
}
