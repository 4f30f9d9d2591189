package nfnetlink

// Kernel tests: they need root and the nft binary, and run every case in
// fresh network namespaces (kproxy-nfttest-<random>), deleted afterwards.
//
// Address ranges used below:
//   10.96.0.0/16, fd00:96::/112     service cluster IPs
//   10.244.0.0/16, fd00:244::/64    pod (endpoint) IPs
//   192.168.0.0/16, fd00:192::/48   node and load balancer addresses
//   203.0.113.0/24, 2001:db8::/32   external clients (source ranges)

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

// kernelNS is a network namespace created for one test.
type kernelNS struct {
	name string
	nl   *Netlink
	ex   *nft.Exec
}

func requireKernel(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("kernel test: needs root to create network namespaces and program nf_tables")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("kernel test: the nft binary is not installed (apt-get install nftables)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("kernel test: the ip binary is not installed (iproute2)")
	}
}

func newKernelNS(t *testing.T) *kernelNS {
	t.Helper()
	requireKernel(t)
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	name := "kproxy-nfttest-" + hex.EncodeToString(rnd[:])
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	ns := &kernelNS{name: name}
	t.Cleanup(func() {
		if ns.nl != nil {
			_ = ns.nl.Close()
		}
		if out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns delete %s: %v: %s", name, err, out)
		}
	})
	nl, err := NewNetlink(WithNetNSPath("/run/netns/" + name))
	if err != nil {
		t.Fatalf("NewNetlink: %v", err)
	}
	ns.nl = nl
	ex, err := nft.NewExec("", nft.WithCommandPrefix("ip", "netns", "exec", name))
	if err != nil {
		t.Fatalf("NewExec: %v", err)
	}
	ns.ex = ex
	return ns
}

func (ns *kernelNS) nft(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns.name, "nft"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// handles in `nft --debug=netlink list` rule headers: "ip t chain HANDLE [POSITION]".
var debugRuleHeader = regexp.MustCompile(`(?m)^((?:ip|ip6) \S+ \S+)( \d+)+$`)

// expires is the time left of elements in sets with timeouts.
var expires = regexp.MustCompile(` expires [0-9hmsd]+`)

// sortElementLines sorts the element lines of each set in a debug
// listing: hash sets iterate in an order that depends on a random seed.
func sortElementLines(s string) string {
	lines := strings.Split(s, "\n")
	for i := 0; i < len(lines); {
		j := i
		for j < len(lines) && strings.HasPrefix(lines[j], "\telement ") {
			j++
		}
		if j > i {
			slices.Sort(lines[i:j])
			i = j
		} else {
			i++
		}
	}
	return strings.Join(lines, "\n")
}

// state is everything we compare between two namespaces: nft's listing,
// its netlink-level listing (expressions, elements with their flags and
// user data) and the raw attributes of tables, chains and sets (flags,
// user data, chosen set backend), without handles.
func (ns *kernelNS) state(t *testing.T, fam nft.Family, table string) (listing, debug, raw string) {
	t.Helper()
	listing = expires.ReplaceAllString(ns.nft(t, "list", "table", string(fam), table), "")
	debug = ns.nft(t, "--debug=netlink", "list", "table", string(fam), table)
	debug = sortElementLines(expires.ReplaceAllString(debugRuleHeader.ReplaceAllString(debug, "$1"), ""))
	raw = ns.rawState(t, fam)
	return
}

func (ns *kernelNS) rawState(t *testing.T, fam nft.Family) string {
	t.Helper()
	c, err := ns.nl.dial()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	skip := map[uint16]map[uint16]bool{
		unix.NFT_MSG_GETTABLE: {4 /* NFTA_TABLE_HANDLE */ : true},
		unix.NFT_MSG_GETCHAIN: {unix.NFTA_CHAIN_HANDLE: true},
		unix.NFT_MSG_GETSET:   {16 /* NFTA_SET_HANDLE */ : true},
	}
	var b strings.Builder
	for _, m := range []uint16{unix.NFT_MSG_GETTABLE, unix.NFT_MSG_GETCHAIN, unix.NFT_MSG_GETSET} {
		replies, err := c.dump(context.Background(), m, nfproto(fam), nil)
		if err != nil {
			t.Fatalf("dump %d: %v", m, err)
		}
		for _, r := range replies {
			fmt.Fprintf(&b, "%d:", m)
			forEachAttr(r, func(typ uint16, data []byte) {
				if !skip[m][typ] {
					fmt.Fprintf(&b, " %d=%x", typ, data)
				}
			})
			b.WriteByte('\n')
		}
	}
	return b.String()
}

func compareStates(t *testing.T, step string, a, b *kernelNS, fam nft.Family, table string) {
	t.Helper()
	la, da, ra := a.state(t, fam, table)
	lb, db, rb := b.state(t, fam, table)
	if d := cmp.Diff(la, lb); d != "" {
		t.Errorf("%s: nft list table differs between netlink (-) and nft -f (+):\n%s", step, d)
	}
	if d := cmp.Diff(da, db); d != "" {
		t.Errorf("%s: nft --debug=netlink list table differs between netlink (-) and nft -f (+):\n%s", step, d)
	}
	if d := cmp.Diff(ra, rb); d != "" {
		t.Errorf("%s: raw table/chain/set attributes differ between netlink (-) and nft -f (+):\n%s", step, d)
	}
	if t.Failed() {
		t.Logf("%s: listing through nft -f:\n%s", step, lb)
	}
}

// applyBoth applies tx through netlink in a and through nft -f in b.
func applyBoth(t *testing.T, a, b *kernelNS, tx *nft.Transaction) (errNetlink, errExec error) {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	errNetlink = a.nl.Apply(ctx, tx)
	t.Logf("netlink: %d operations in %v", tx.Len(), time.Since(start))
	start = time.Now()
	errExec = b.ex.Apply(ctx, tx)
	t.Logf("nft -f: %d operations in %v", tx.Len(), time.Since(start))
	return
}

func TestKernelNetlinkMatchesNft(t *testing.T) {
	for _, fam := range []nft.Family{nft.IPv4, nft.IPv6} {
		t.Run(string(fam), func(t *testing.T) {
			a, b := newKernelNS(t), newKernelNS(t)
			addrs := nft.SampleAddrsFor(fam)

			steps := []struct {
				name string
				tx   func() *nft.Transaction
			}{
				{"create everything", func() *nft.Transaction { return nft.Sample(addrs) }},
				{"partial update", func() *nft.Transaction {
					tx := nft.NewTransaction(fam, nft.SampleTable)
					tx.Add(&nft.Chain{Name: "endpoint-3"})
					tx.Add(&nft.Rule{Chain: "endpoint-3", Stmts: []nft.Stmt{nft.DNAT{Proto: v1.ProtocolTCP, To: netip.AddrPortFrom(addrs.Pod2, 8080)}}})
					tx.Flush(&nft.Chain{Name: "service-1"})
					tx.Add(&nft.Rule{Chain: "service-1", Stmts: []nft.Stmt{nft.NumgenVmap{Chains: []string{"endpoint-1", "endpoint-2", "endpoint-3"}}}})
					// Inserted rules go to the head of the chain, each before the previous one.
					tx.Insert(&nft.Rule{Chain: "service-1", Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Goto, Chain: "endpoint-2"}}})
					tx.Insert(&nft.Rule{Chain: "service-1", Stmts: []nft.Stmt{nft.MatchNumgen{Mod: 2, Value: 0}, nft.Verdict{Kind: nft.Goto, Chain: "endpoint-3"}}})
					// A set that already has elements: no first segment.
					tx.Add(&nft.Element{Set: "nodeport-ips", Key: []nft.Value{{Prefix: addrs.PodNet}}})
					tx.Delete(&nft.Element{Set: "nodeport-ips", Key: []nft.Value{{Addr: addrs.Svc1}}})
					tx.Delete(&nft.Element{Set: "service-ips", Key: []nft.Value{{Addr: addrs.Svc2}, {Proto: v1.ProtocolUDP}, {Port: 53}}})
					tx.Add(&nft.Element{Set: "service-ips", Key: []nft.Value{{Addr: addrs.Svc2}, {Proto: v1.ProtocolSCTP}, {Port: 9}}, Verdict: &nft.Verdict{Kind: nft.Goto, Chain: "service-1"}})
					tx.Delete(&nft.Element{Set: "cluster-ips", Key: []nft.Value{{Addr: addrs.Svc2}}})
					tx.Flush(&nft.Chain{Name: "misc"})
					tx.Delete(&nft.Chain{Name: "misc"})
					// A service of the endpoint map changes: fresh keys, the
					// old ones deleted.
					tx.Insert(&nft.Rule{Chain: "service-2", Stmts: []nft.Stmt{nft.DNATMap{Proto: v1.ProtocolTCP, Mod: 1, Offset: 7, Map: "endpoints-0"}}})
					tx.Add(&nft.Rule{Chain: "service-2", Stmts: []nft.Stmt{nft.DNATMap{Proto: v1.ProtocolUDP, Mod: 1, Offset: 0, Map: "endpoints-2"}}})
					tx.Add(&nft.Element{Set: "endpoints-2", Index: 0, To: netip.AddrPortFrom(addrs.Pod1, 53)})
					tx.Add(&nft.Element{Set: "endpoints-0", Index: 7, To: netip.AddrPortFrom(addrs.Pod2, 53)})
					tx.Delete(&nft.Element{Set: "endpoints-0", Index: 1, To: netip.AddrPortFrom(addrs.Pod2, 80)})
					// An endpoint of a service sharing cluster-tcp-2
					// changes, and a service moves to another count.
					tx.Delete(&nft.Element{Set: "cluster-endpoints-tcp", Key: []nft.Value{{Addr: addrs.Svc1}, {Port: 8080}}, Index: 1, To: netip.AddrPortFrom(addrs.Pod2, 65535)})
					tx.Add(&nft.Element{Set: "cluster-endpoints-tcp", Key: []nft.Value{{Addr: addrs.Svc1}, {Port: 8080}}, Index: 1, To: netip.AddrPortFrom(addrs.Pod1, 8081)})
					tx.Add(&nft.Chain{Name: "cluster-tcp-3"})
					tx.Add(&nft.Rule{Chain: "cluster-tcp-3", Stmts: []nft.Stmt{nft.DNATByService{Proto: v1.ProtocolTCP, Mod: 3, Map: "cluster-endpoints-tcp"}}})
					tx.Delete(&nft.Element{Set: "service-ips", Key: []nft.Value{{Addr: addrs.Svc1}, {Proto: v1.ProtocolTCP}, {Port: 8080}}})
					tx.Add(&nft.Element{Set: "service-ips", Key: []nft.Value{{Addr: addrs.Svc1}, {Proto: v1.ProtocolTCP}, {Port: 8080}}, Verdict: &nft.Verdict{Kind: nft.Goto, Chain: "cluster-tcp-3"}})
					tx.Add(&nft.Element{Set: "cluster-endpoints-tcp", Key: []nft.Value{{Addr: addrs.Svc1}, {Port: 8080}}, Index: 2, To: netip.AddrPortFrom(addrs.Pod2, 8082)})
					tx.Flush(&nft.Chain{Name: "cluster-udp-1"})
					tx.Delete(&nft.Chain{Name: "cluster-udp-1"})
					return tx
				}},
				{"refill and recreate", func() *nft.Transaction {
					tx := nft.NewTransaction(fam, nft.SampleTable)
					tx.Add(&nft.Set{Name: "nodeport-ips", Key: []nft.DataType{nft.AddrType(fam)}, Interval: true})
					tx.Flush(&nft.Set{Name: "nodeport-ips", Key: []nft.DataType{nft.AddrType(fam)}, Interval: true})
					tx.Add(&nft.Element{Set: "nodeport-ips", Key: []nft.Value{{Prefix: addrs.NodeNet}}})
					tx.Add(&nft.Set{Name: "new-interval", Key: []nft.DataType{nft.AddrType(fam)}, Interval: true, Comment: "new"})
					tx.Add(&nft.Element{Set: "new-interval", Key: []nft.Value{{Prefix: addrs.PodNet}}, Comment: "pods"})
					tx.Flush(&nft.Set{Name: "triples"})
					tx.Delete(&nft.Set{Name: "triples"})
					tx.Flush(&nft.Table{})
					return tx
				}},
			}
			for _, st := range steps {
				tx := st.tx()
				errN, errE := applyBoth(t, a, b, tx)
				if errN != nil || errE != nil {
					t.Fatalf("%s: netlink: %v; nft -f: %v\ntransaction:\n%s", st.name, errN, errE, tx)
				}
				compareStates(t, st.name, a, b, fam, nft.SampleTable)
			}
		})
	}
}

func TestKernelFailedTransactionChangesNothing(t *testing.T) {
	for _, fam := range []nft.Family{nft.IPv4, nft.IPv6} {
		t.Run(string(fam), func(t *testing.T) {
			a, b := newKernelNS(t), newKernelNS(t)
			addrs := nft.SampleAddrsFor(fam)
			if errN, errE := applyBoth(t, a, b, nft.Sample(addrs)); errN != nil || errE != nil {
				t.Fatalf("setup: netlink: %v; nft -f: %v", errN, errE)
			}
			la0, da0, ra0 := a.state(t, fam, nft.SampleTable)
			lb0, db0, rb0 := b.state(t, fam, nft.SampleTable)

			tx := nft.NewTransaction(fam, nft.SampleTable)
			tx.Add(&nft.Chain{Name: "endpoint-9"})
			tx.Add(&nft.Rule{Chain: "endpoint-9", Stmts: []nft.Stmt{nft.DNAT{Proto: v1.ProtocolTCP, To: netip.AddrPortFrom(addrs.Pod2, 80)}}})
			tx.Add(&nft.Element{Set: "cluster-ips", Key: []nft.Value{{Addr: addrs.Pod2}}})
			tx.Flush(&nft.Chain{Name: "services"})
			tx.Delete(&nft.Element{Set: "service-ips", Key: []nft.Value{{Addr: addrs.Svc1}, {Proto: v1.ProtocolTCP}, {Port: 80}}})
			tx.Add(&nft.Rule{Chain: "service-1", Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Goto, Chain: "no-such-chain"}}})
			last := tx.Len() - 1

			errN, errE := applyBoth(t, a, b, tx)
			for name, err := range map[string]error{"netlink": errN, "nft -f": errE} {
				if !errors.Is(err, unix.ENOENT) {
					t.Errorf("%s: got error %v, want ENOENT", name, err)
				}
				var oe *nft.OpError
				if !errors.As(err, &oe) || oe.Index != last {
					t.Errorf("%s: error %v does not name operation %d", name, err, last)
				} else {
					t.Logf("%s: %v", name, err)
				}
			}
			la, da, ra := a.state(t, fam, nft.SampleTable)
			lb, db, rb := b.state(t, fam, nft.SampleTable)
			for _, c := range []struct{ name, before, after string }{
				{"netlink listing", la0, la}, {"netlink debug listing", da0, da}, {"netlink raw", ra0, ra},
				{"nft -f listing", lb0, lb}, {"nft -f debug listing", db0, db}, {"nft -f raw", rb0, rb},
			} {
				if d := cmp.Diff(c.before, c.after); d != "" {
					t.Errorf("%s changed by a failed transaction (-before +after):\n%s", c.name, d)
				}
			}
		})
	}
}

func TestKernelErrorsNameTheCulprit(t *testing.T) {
	ns := newKernelNS(t)
	ctx := context.Background()
	addrs := nft.SampleAddrsFor(nft.IPv4)
	if err := ns.nl.Apply(ctx, nft.Sample(addrs)); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		build  func(tx *nft.Transaction)
		errno  error
		index  int
		detail string
	}{
		{
			name: "element with a different verdict",
			build: func(tx *nft.Transaction) {
				tx.Add(&nft.Element{Set: "service-ips", Key: []nft.Value{{Addr: addrs.Svc2}, {Proto: v1.ProtocolTCP}, {Port: 1}}, Verdict: &nft.Verdict{Kind: nft.Drop}})
				tx.Add(&nft.Element{Set: "service-ips", Key: []nft.Value{{Addr: addrs.Svc1}, {Proto: v1.ProtocolTCP}, {Port: 80}}, Verdict: &nft.Verdict{Kind: nft.Drop}})
				tx.Add(&nft.Element{Set: "service-ips", Key: []nft.Value{{Addr: addrs.Svc2}, {Proto: v1.ProtocolTCP}, {Port: 2}}, Verdict: &nft.Verdict{Kind: nft.Drop}})
			},
			errno: unix.EEXIST, index: 1,
		},
		{
			name: "delete a missing element",
			build: func(tx *nft.Transaction) {
				tx.Delete(&nft.Element{Set: "cluster-ips", Key: []nft.Value{{Addr: addrs.Svc1}}})
				tx.Delete(&nft.Element{Set: "cluster-ips", Key: []nft.Value{{Addr: addrs.Pod1}}})
			},
			errno: unix.ENOENT, index: 1,
		},
		{
			name: "jump to a missing chain",
			build: func(tx *nft.Transaction) {
				tx.Add(&nft.Rule{Chain: "services", Stmts: []nft.Stmt{nft.MatchCtStateNew{}, nft.Verdict{Kind: nft.Jump, Chain: "nope"}}})
			},
			errno: unix.ENOENT, index: 0, detail: "statement jump nope",
		},
		{
			name:  "delete a chain still referenced",
			build: func(tx *nft.Transaction) { tx.Delete(&nft.Chain{Name: "service-1"}) },
			errno: unix.EBUSY, index: 0,
		},
		{
			name: "change a base chain's hook",
			build: func(tx *nft.Transaction) {
				tx.Add(&nft.Chain{Name: "filter-input", Type: nft.TypeFilter, Hook: nft.HookOutput})
			},
			errno: unix.EOPNOTSUPP, index: 0,
		},
		{
			name:  "masquerade reachable from prerouting",
			build: func(tx *nft.Transaction) { tx.Add(&nft.Rule{Chain: "services", Stmts: []nft.Stmt{nft.Masquerade{}}}) },
			errno: unix.EOPNOTSUPP, index: 0,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tx := nft.NewTransaction(nft.IPv4, nft.SampleTable)
			c.build(tx)
			err := ns.nl.Apply(ctx, tx)
			t.Logf("error: %v", err)
			if !errors.Is(err, c.errno) {
				t.Fatalf("got %v, want %v", err, c.errno)
			}
			var oe *nft.OpError
			if !errors.As(err, &oe) {
				t.Fatalf("%v is not an *OpError", err)
			}
			if oe.Index != c.index || oe.Op != tx.OpText(c.index) {
				t.Errorf("error names operation %d %q, want %d %q", oe.Index, oe.Op, c.index, tx.OpText(c.index))
			}
			if c.detail != "" && oe.Detail != c.detail {
				t.Errorf("detail %q, want %q", oe.Detail, c.detail)
			}
		})
	}
}

func TestKernelLargeMapIsOneBatch(t *testing.T) {
	for _, fam := range []nft.Family{nft.IPv4, nft.IPv6} {
		t.Run(string(fam), func(t *testing.T) {
			ns := newKernelNS(t)
			ctx := context.Background()
			addr := nft.AddrType(fam)
			base := netip.MustParseAddr("10.0.0.0")
			if fam == nft.IPv6 {
				base = netip.MustParseAddr("fd00::")
			}
			build := func(n int, poison bool) *nft.Transaction {
				tx := nft.NewTransaction(fam, nft.SampleTable)
				tx.Add(&nft.Table{})
				tx.Add(&nft.Chain{Name: "service-with-a-long-name-like-kube-proxy-uses"})
				tx.Add(&nft.Set{Name: "service-ips", Key: []nft.DataType{addr, nft.TypeInetProto, nft.TypeInetService}, Data: nft.TypeVerdict})
				a := base
				for i := 0; i < n; i++ {
					a = a.Next()
					tx.Add(&nft.Element{Set: "service-ips", Key: []nft.Value{{Addr: a}, {Proto: v1.ProtocolTCP}, {Port: uint16(i % 65536)}},
						Verdict: &nft.Verdict{Kind: nft.Goto, Chain: "service-with-a-long-name-like-kube-proxy-uses"}, Comment: fmt.Sprintf("ns/svc-%d:http", i)})
				}
				if poison {
					tx.Add(&nft.Element{Set: "service-ips", Key: []nft.Value{{Addr: base}, {Proto: v1.ProtocolTCP}, {Port: 1}}, Verdict: &nft.Verdict{Kind: nft.Goto, Chain: "missing"}})
				}
				return tx
			}
			const n = 10000
			// All or nothing: a bad last element keeps the other 10000 out.
			if err := ns.nl.Apply(ctx, build(n, true)); !errors.Is(err, unix.ENOENT) {
				t.Fatalf("poisoned transaction: got %v, want ENOENT", err)
			}
			if ok, err := ns.nl.TableExists(ctx, fam, nft.SampleTable); err != nil || ok {
				t.Fatalf("after a failed transaction the table exists=%v (err %v)", ok, err)
			}
			tx := build(n, false)
			start := time.Now()
			if err := ns.nl.Apply(ctx, tx); err != nil {
				t.Fatal(err)
			}
			t.Logf("%d elements through netlink in %v", n, time.Since(start))
			if got := ns.countElements(t, fam, "service-ips"); got != n {
				t.Errorf("map has %d elements, want %d", got, n)
			}
		})
	}
}

// TestKernelSetDefsShareASocket: transactions that add elements to many
// existing sets read their definitions over one socket, kept open, not
// one each (a burst's partial sync asks for hundreds; a socket each was
// half its CPU, and closing one after each sync 10-15 ms of latency).
func TestKernelSetDefsShareASocket(t *testing.T) {
	ns := newKernelNS(t)
	ctx := context.Background()
	const sets = 60
	name := func(i int) string { return fmt.Sprintf("ips-%d", i) }
	tx := nft.NewTransaction(nft.IPv4, nft.SampleTable)
	tx.Add(&nft.Table{})
	for i := range sets {
		tx.Add(&nft.Set{Name: name(i), Key: []nft.DataType{nft.TypeIPv4Addr}})
	}
	if err := ns.nl.Apply(ctx, tx); err != nil {
		t.Fatal(err)
	}
	tx = nft.NewTransaction(nft.IPv4, nft.SampleTable)
	for i := range sets {
		tx.Add(&nft.Element{Set: name(i), Key: []nft.Value{{Addr: netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)})}}})
	}
	before := ns.nl.dials.Load()
	if err := ns.nl.Apply(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if d := ns.nl.dials.Load() - before; d > 1 {
		t.Errorf("%d sockets opened for one transaction's %d set definitions, want 1", d, sets)
	}
	// The next transaction asks over the same socket.
	tx = nft.NewTransaction(nft.IPv4, nft.SampleTable)
	for i := range sets {
		tx.Add(&nft.Element{Set: name(i), Key: []nft.Value{{Addr: netip.AddrFrom4([4]byte{10, 0, 1, byte(i + 1)})}}})
	}
	before = ns.nl.dials.Load()
	if err := ns.nl.Apply(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if d := ns.nl.dials.Load() - before; d != 0 {
		t.Errorf("%d sockets opened by a second transaction, want none", d)
	}
	for _, i := range []int{0, sets - 1} {
		if got := ns.countElements(t, nft.IPv4, name(i)); got != 2 {
			t.Errorf("set %s has %d elements, want 2", name(i), got)
		}
	}
}

func (ns *kernelNS) countElements(t *testing.T, fam nft.Family, set string) int {
	t.Helper()
	c, err := ns.nl.dial()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var a attrs
	a.str(unix.NFTA_SET_ELEM_LIST_TABLE, nft.SampleTable)
	a.str(unix.NFTA_SET_ELEM_LIST_SET, set)
	n := 0
	err = c.dumpEach(context.Background(), unix.NFT_MSG_GETSETELEM, nfproto(fam), a.b, func(b []byte) bool {
		forEachAttr(b, func(typ uint16, data []byte) {
			if typ == unix.NFTA_SET_ELEM_LIST_ELEMENTS {
				forEachAttr(data, func(uint16, []byte) { n++ })
			}
		})
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestKernelListings(t *testing.T) {
	ns := newKernelNS(t)
	ctx := context.Background()
	for _, impl := range []struct {
		name string
		nft  nft.Interface
	}{{"netlink", ns.nl}, {"exec", ns.ex}} {
		t.Run(impl.name, func(t *testing.T) {
			if ok, err := impl.nft.TableExists(ctx, nft.IPv4, nft.SampleTable); err != nil || ok {
				t.Fatalf("TableExists before creation = %v, %v", ok, err)
			}
			if _, err := impl.nft.ListChains(ctx, nft.IPv4, nft.SampleTable); !errors.Is(err, nft.ErrNotFound) {
				t.Errorf("ListChains of a missing table: %v, want ErrNotFound", err)
			}
			if err := impl.nft.DeleteTable(ctx, nft.IPv4, nft.SampleTable); err != nil {
				t.Errorf("DeleteTable of a missing table: %v", err)
			}
			if err := impl.nft.Apply(ctx, nft.Sample(nft.SampleAddrsFor(nft.IPv4))); err != nil {
				t.Fatal(err)
			}
			if ok, err := impl.nft.TableExists(ctx, nft.IPv4, nft.SampleTable); err != nil || !ok {
				t.Fatalf("TableExists after creation = %v, %v", ok, err)
			}
			if ok, err := impl.nft.TableExists(ctx, nft.IPv6, nft.SampleTable); err != nil || ok {
				t.Fatalf("TableExists(ip6) = %v, %v", ok, err)
			}
			chains, err := impl.nft.ListChains(ctx, nft.IPv4, nft.SampleTable)
			if err != nil {
				t.Fatal(err)
			}
			wantChains := []string{"cluster-tcp-2", "cluster-udp-1", "endpoint-1", "endpoint-2", "filter-forward", "filter-input", "firewall-1", "mark-for-masquerade",
				"masquerading", "misc", "nat-output", "nat-postrouting", "nat-prerouting", "reject-chain", "service-1", "service-2", "services"}
			if d := cmp.Diff(wantChains, chains); d != "" {
				t.Errorf("ListChains (-want +got):\n%s", d)
			}
			sets, err := impl.nft.ListSets(ctx, nft.IPv4, nft.SampleTable)
			if err != nil {
				t.Fatal(err)
			}
			wantSets := []string{"affinity-1", "by-addr", "cluster-endpoints-sctp", "cluster-endpoints-tcp", "cluster-endpoints-udp", "cluster-ips", "endpoints-0", "endpoints-1", "endpoints-2", "firewall-ips", "hairpin", "no-endpoint-nodeports", "no-endpoint-services", "nodeport-ips",
				"ports", "protos", "service-ips", "service-nodeports", "triples", "zero-ips"}
			if d := cmp.Diff(wantSets, sets); d != "" {
				t.Errorf("ListSets (-want +got):\n%s", d)
			}
			if err := impl.nft.DeleteTable(ctx, nft.IPv4, nft.SampleTable); err != nil {
				t.Fatal(err)
			}
			if ok, err := impl.nft.TableExists(ctx, nft.IPv4, nft.SampleTable); err != nil || ok {
				t.Fatalf("TableExists after deletion = %v, %v", ok, err)
			}
		})
	}
}

// A full sync of a large cluster is one batch of tens of thousands of
// messages and several megabytes.
const largeServices = 5000

// largeTx is a full sync of largeServices services with two endpoints each.
func largeTx() *nft.Transaction {
	const services = largeServices
	tx := nft.NewTransaction(nft.IPv4, nft.SampleTable)
	tx.Add(&nft.Table{})
	tx.Add(&nft.Chain{Name: "nat-prerouting", Type: nft.TypeNAT, Hook: nft.HookPrerouting, Priority: nft.PriorityDstNAT})
	tx.Add(&nft.Chain{Name: "mark-for-masquerade"})
	tx.Add(&nft.Rule{Chain: "mark-for-masquerade", Stmts: []nft.Stmt{nft.SetMarkOr{Mask: 0x4000}}})
	tx.Add(&nft.Set{Name: "service-ips", Key: []nft.DataType{nft.TypeIPv4Addr, nft.TypeInetProto, nft.TypeInetService}, Data: nft.TypeVerdict})
	tx.Add(&nft.Rule{Chain: "nat-prerouting", Stmts: []nft.Stmt{nft.VmapLookup{Fields: []nft.Field{nft.FieldDaddr, nft.FieldL4Proto, nft.FieldDport}, Map: "service-ips"}}})
	svc := netip.MustParseAddr("10.96.0.0")
	pod := netip.MustParseAddr("10.244.0.0")
	for i := 0; i < services; i++ {
		svc = svc.Next()
		name := fmt.Sprintf("service-%08x-ns%d/svc%d/tcp/http", i, i%50, i)
		var eps []string
		for j := 0; j < 2; j++ {
			pod = pod.Next()
			ep := fmt.Sprintf("endpoint-%08x-ns%d/svc%d/tcp/http__%s/8080", i*2+j, i%50, i, pod)
			eps = append(eps, ep)
			tx.Add(&nft.Chain{Name: ep})
			tx.Add(&nft.Rule{Chain: ep, Stmts: []nft.Stmt{nft.MatchAddr{Source: true, Prefixes: []netip.Prefix{single(pod)}}, nft.Verdict{Kind: nft.Jump, Chain: "mark-for-masquerade"}}})
			tx.Add(&nft.Rule{Chain: ep, Stmts: []nft.Stmt{nft.DNAT{Proto: v1.ProtocolTCP, To: netip.AddrPortFrom(pod, 8080)}}})
		}
		tx.Add(&nft.Chain{Name: name})
		tx.Add(&nft.Rule{Chain: name, Stmts: []nft.Stmt{nft.MatchAddr{Source: true, Negate: true, Prefixes: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}, nft.Verdict{Kind: nft.Jump, Chain: "mark-for-masquerade"}}})
		tx.Add(&nft.Rule{Chain: name, Stmts: []nft.Stmt{nft.NumgenVmap{Chains: eps}}, Comment: fmt.Sprintf("ns%d/svc%d:http", i%50, i)})
		tx.Add(&nft.Element{Set: "service-ips", Key: []nft.Value{{Addr: svc}, {Proto: v1.ProtocolTCP}, {Port: 80}}, Verdict: &nft.Verdict{Kind: nft.Goto, Chain: name}})
	}
	return tx
}

func TestKernelLargeLayout(t *testing.T) {
	ns := newKernelNS(t)
	ctx := context.Background()
	const services = largeServices
	tx := largeTx()
	start := time.Now()
	if err := ns.nl.Apply(ctx, tx); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d operations (%d services) through netlink in %v", tx.Len(), services, time.Since(start))
	chains, err := ns.nl.ListChains(ctx, nft.IPv4, nft.SampleTable)
	if err != nil {
		t.Fatal(err)
	}
	if want := 2 + 3*services; len(chains) != want {
		t.Errorf("%d chains, want %d", len(chains), want)
	}
	if got := ns.countElements(t, nft.IPv4, "service-ips"); got != services {
		t.Errorf("%d map elements, want %d", got, services)
	}
}

func single(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }
