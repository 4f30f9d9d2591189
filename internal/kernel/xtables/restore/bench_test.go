package restore_test

// Benchmarks of the restore simulator through its two users, the xtables
// fake and the iptables tracer: a full restore of a nat table of 10k
// services (one endpoint each) and a --noflush restore rewriting one
// service. Addresses: 10.96.0.0/16 cluster IPs, 10.244.0.0/16 pod IPs.

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/kernel/xtables/xtablestest"
	iptrace "github.com/kproxy/kproxy/internal/trace/iptables"
)

// natDump is iptables-save output of a nat table with n services.
func natDump(n int) string {
	var b strings.Builder
	b.WriteString("*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-SERVICES - [0:0]\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, ":KUBE-SVC-%016d - [0:0]\n:KUBE-SEP-%016d - [0:0]\n", i, i)
	}
	b.WriteString("-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n")
	for i := 0; i < n; i++ {
		ip := fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)
		ep := fmt.Sprintf("10.244.%d.%d", i/250, i%250+1)
		fmt.Fprintf(&b, "-A KUBE-SERVICES -d %s/32 -p tcp -m comment --comment \"ns/svc%d:http cluster IP\" -m tcp --dport 80 -j KUBE-SVC-%016d\n", ip, i, i)
		fmt.Fprintf(&b, "-A KUBE-SVC-%016d -m comment --comment \"ns/svc%d:http -> %s:8080\" -j KUBE-SEP-%016d\n", i, i, ep, i)
		fmt.Fprintf(&b, "-A KUBE-SEP-%016d -s %s/32 -m comment --comment ns/svc%d:http -j KUBE-MARK-MASQ\n", i, ep, i)
		fmt.Fprintf(&b, "-A KUBE-SEP-%016d -p tcp -m comment --comment ns/svc%d:http -m tcp -j DNAT --to-destination %s:8080\n", i, i, ep)
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// partial rewrites one service's chains with --noflush.
func partial(i int) string {
	ep := "10.244.200.1"
	return fmt.Sprintf("*nat\n:KUBE-SVC-%016d - [0:0]\n:KUBE-SEP-%016d - [0:0]\n-A KUBE-SVC-%016d -j KUBE-SEP-%016d\n-A KUBE-SEP-%016d -s %s/32 -j KUBE-MARK-MASQ\n-A KUBE-SEP-%016d -p tcp -m tcp -j DNAT --to-destination %s:8080\nCOMMIT\n", i, i, i, i, i, ep, i, ep)
}

func BenchmarkFakeFullRestore10k(b *testing.B) {
	in := []byte(natDump(10000))
	for b.Loop() {
		f := xtablestest.NewFake(xtables.NFT, xtables.IPv4)
		if err := f.Restore(context.Background(), in, xtables.RestoreOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFakePartialRestore10k(b *testing.B) {
	f := xtablestest.NewFake(xtables.NFT, xtables.IPv4)
	if err := f.Restore(context.Background(), []byte(natDump(10000)), xtables.RestoreOptions{}); err != nil {
		b.Fatal(err)
	}
	in := []byte(partial(77))
	for b.Loop() {
		if err := f.Restore(context.Background(), in, xtables.RestoreOptions{NoFlush: true}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkTracerParse10k(b *testing.B) {
	in := []byte(natDump(10000))
	for b.Loop() {
		if _, err := iptrace.Parse(in); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkTracerPartialApply10k(b *testing.B) {
	r, err := iptrace.Parse([]byte(natDump(10000)))
	if err != nil {
		b.Fatal(err)
	}
	in := []byte(partial(77))
	for b.Loop() {
		if err := r.Apply(in, true); err != nil {
			b.Fatal(err)
		}
	}
}
