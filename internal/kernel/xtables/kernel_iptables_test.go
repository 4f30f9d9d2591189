package xtables

// Kernel tests of the iptables-mode runner and of the backend choice, as
// root in fresh network namespaces, through `ip netns exec`. Address
// ranges: see leftovers_test.go; 198.51.100.0/24 and fd00:51::/64 are a
// user's addresses in the detection states.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// splitTables cuts normalized save output into its tables, by name.
func splitTables(save string) map[string]string {
	out := map[string]string{}
	for _, t := range strings.SplitAfter(normalize(save), "COMMIT\n") {
		if t == "" {
			continue
		}
		name := strings.TrimPrefix(strings.SplitN(t, "\n", 2)[0], "*")
		out[name] = t
	}
	return out
}

func TestKernelRestoreSave(t *testing.T) {
	fixtures := map[Family]string{IPv4: "iptables-v4.save", IPv6: "iptables-v6.save"}
	for _, b := range Backends {
		for _, f := range Families {
			t.Run(fmt.Sprintf("%s/%s", b, f), func(t *testing.T) {
				k := newKernelCase(t, b, f)
				ipt, err := New(b, f, k.opts()...)
				if err != nil {
					t.Fatal(err)
				}
				ctx := context.Background()
				v, err := ipt.Version(ctx)
				if err != nil {
					t.Fatalf("Version: %v", err)
				}
				t.Logf("iptables %s", v)

				fixture := readFixture(t, fixtures[f])
				st, err := ipt.RestoreWithStats(ctx, []byte(fixture), RestoreOptions{})
				if err != nil {
					t.Fatal(err)
				}
				// The xtables lock is one file for the whole host: other
				// tests' legacy restores may hold it, so a wait is
				// possible, but it is part of the duration.
				if st.Duration <= 0 || st.LockWait < 0 || st.LockWait > st.Duration {
					t.Errorf("stats = %+v, want a duration that includes the lock wait", st)
				}
				want := splitTables(fixture)
				for table, w := range want {
					got, err := ipt.Save(ctx, table)
					if err != nil {
						t.Fatal(err)
					}
					if d := cmp.Diff(w, normalize(string(got))); d != "" {
						t.Errorf("Save(%s) after Restore (-fixture +kernel):\n%s", table, d)
					}
				}

				// --noflush: one chain of nat is rewritten, the other
				// tables and chains stay.
				update := "*nat\n:KUBE-MARK-MASQ - [0:0]\n-A KUBE-MARK-MASQ -j MARK --set-xmark 0x8000/0x8000\nCOMMIT\n"
				if err := ipt.Restore(ctx, []byte(update), RestoreOptions{NoFlush: true}); err != nil {
					t.Fatal(err)
				}
				after := splitTables(k.dump(t))
				if d := cmp.Diff(want["filter"], after["filter"]); d != "" {
					t.Errorf("filter changed by a nat --noflush restore:\n%s", d)
				}
				wantNAT := strings.Replace(want["nat"], "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000", "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x8000/0x8000", 1)
				if wantNAT == want["nat"] {
					t.Fatal("the fixture has no KUBE-MARK-MASQ rule to replace")
				}
				if d := cmp.Diff(wantNAT, after["nat"]); d != "" {
					t.Errorf("nat after --noflush (-want +got):\n%s", d)
				}

				// Without --noflush the named table is replaced.
				replace := "*mangle\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n"
				if err := ipt.Restore(ctx, []byte(replace), RestoreOptions{}); err != nil {
					t.Fatal(err)
				}
				got, err := ipt.Save(ctx, "mangle")
				if err != nil {
					t.Fatal(err)
				}
				if d := cmp.Diff(replace, normalize(string(got))); d != "" {
					t.Errorf("mangle after a flushing restore (-want +got):\n%s", d)
				}
			})
		}
	}
}

// TestKernelRestoreErrors: what the kernel and iptables-restore reject
// comes back as a *RestoreError naming the line, and a table whose
// restore fails is left as it was; the tables committed before it stay
// (iptables-restore commits at each COMMIT, with both backends).
func TestKernelRestoreErrors(t *testing.T) {
	const before = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-A - [0:0]\n-A KUBE-A -j ACCEPT\nCOMMIT\n"
	tests := []struct {
		name  string
		input string
		line  int
		// nftLine is the line the nft backend names when it differs.
		nftLine    int
		wantFilter string // "" means unchanged
	}{
		{name: "jump to a missing chain", input: "*filter\n-A INPUT -j KUBE-NOPE\nCOMMIT\n", line: 2, nftLine: 3},
		{name: "deleting a chain with rules", input: "*filter\n-X KUBE-A\nCOMMIT\n", line: 2},
		{name: "missing COMMIT", input: "*filter\n-A INPUT -j KUBE-A\n", line: 3},
		{
			name:  "second table fails, first stays",
			input: "*filter\n:KUBE-B - [0:0]\nCOMMIT\n*nat\n-A KUBE-NOPE -j ACCEPT\nCOMMIT\n", line: 5,
			wantFilter: "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-A - [0:0]\n:KUBE-B - [0:0]\n-A KUBE-A -j ACCEPT\nCOMMIT\n",
		},
	}
	for _, b := range Backends {
		for _, tc := range tests {
			t.Run(fmt.Sprintf("%s/%s", b, tc.name), func(t *testing.T) {
				k := newKernelCase(t, b, IPv4)
				k.load(t, before)
				ipt, err := New(b, IPv4, k.opts()...)
				if err != nil {
					t.Fatal(err)
				}
				err = ipt.Restore(context.Background(), []byte(tc.input), RestoreOptions{NoFlush: true})
				var re *RestoreError
				if !errors.As(err, &re) {
					t.Fatalf("err = %v, want a *RestoreError", err)
				}
				t.Logf("%v", err)
				line := tc.line
				if b == NFT && tc.nftLine != 0 {
					line = tc.nftLine
				}
				if re.Line != line || errors.Is(err, ErrLockTimeout) {
					t.Errorf("line %d (lock timeout %v), want line %d", re.Line, errors.Is(err, ErrLockTimeout), line)
				}
				want := tc.wantFilter
				if want == "" {
					want = before
				}
				if d := cmp.Diff(want, splitTables(k.dump(t))["filter"]); d != "" {
					t.Errorf("filter after the failed restore (-want +got):\n%s", d)
				}
			})
		}
	}
}

// TestKernelLockTimeout holds the xtables lock (a private lock file, named
// with XTABLES_LOCKFILE, which iptables reads too: the host's lock stays
// free for everybody else on the machine).
func TestKernelLockTimeout(t *testing.T) {
	k := newKernelCase(t, Legacy, IPv4)
	lock := filepath.Join(t.TempDir(), "xtables.lock")
	t.Setenv("XTABLES_LOCKFILE", lock)
	holder, err := os.OpenFile(lock, os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	hold := func() {
		if err := syscall.Flock(int(holder.Fd()), syscall.LOCK_EX); err != nil {
			t.Fatal(err)
		}
	}
	release := func() { _ = syscall.Flock(int(holder.Fd()), syscall.LOCK_UN) }
	ctx := context.Background()
	input := []byte("*filter\n:KUBE-A - [0:0]\nCOMMIT\n")

	t.Run("iptables gives up after -w", func(t *testing.T) {
		hold()
		defer release()
		noProbe := withLockProbe(func(context.Context, time.Duration) (time.Duration, error) { return 0, nil })
		ipt, err := New(Legacy, IPv4, append(k.opts(), WithLockWait(time.Second), noProbe)...)
		if err != nil {
			t.Fatal(err)
		}
		st, err := ipt.RestoreWithStats(ctx, input, RestoreOptions{})
		if !errors.Is(err, ErrLockTimeout) || !strings.Contains(err.Error(), "Stopped waiting after 1s") {
			t.Errorf("err = %v, want ErrLockTimeout from iptables", err)
		}
		if st.Duration < time.Second {
			t.Errorf("duration %v, want at least the 1s wait", st.Duration)
		}
	})
	t.Run("kproxy gives up before running iptables", func(t *testing.T) {
		hold()
		defer release()
		ipt, err := New(Legacy, IPv4, append(k.opts(), WithLockWait(time.Second))...)
		if err != nil {
			t.Fatal(err)
		}
		st, err := ipt.RestoreWithStats(ctx, input, RestoreOptions{})
		if !errors.Is(err, ErrLockTimeout) || st.LockWait < time.Second {
			t.Errorf("RestoreWithStats = %+v, %v; want ErrLockTimeout after 1s", st, err)
		}
	})
	if strings.Contains(k.dump(t), "KUBE-A") {
		t.Fatal("a restore ran while the lock was held")
	}
	t.Run("lock released during the wait", func(t *testing.T) {
		hold()
		go func() {
			time.Sleep(300 * time.Millisecond)
			release()
		}()
		ipt, err := New(Legacy, IPv4, k.opts()...)
		if err != nil {
			t.Fatal(err)
		}
		st, err := ipt.RestoreWithStats(ctx, input, RestoreOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if st.LockWait < 200*time.Millisecond || st.Duration < st.LockWait {
			t.Errorf("stats = %+v, want a lock wait of about 300ms within the duration", st)
		}
		if !strings.Contains(k.dump(t), ":KUBE-A - [0:0]") {
			t.Error("restore did not apply")
		}
	})
}

// tableList is what exists in a namespace: the legacy tables of both
// families and every nf_tables table (where iptables-nft keeps its tables).
func (k *kernelCase) tableList(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, f := range []string{"ip_tables_names", "ip6_tables_names"} {
		for _, n := range strings.Fields(k.run(t, "", "cat", "/proc/net/"+f)) {
			out = append(out, "legacy "+f[:len(f)-len("_tables_names")]+" "+n)
		}
	}
	for _, l := range strings.Split(k.run(t, "", "nft", "list", "tables"), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	slices.Sort(out)
	return out
}

const (
	hintMangle   = "*mangle\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-IPTABLES-HINT - [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n"
	canaryOnlyNA = "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n"
	userRulesV4  = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n-A INPUT -s 198.51.100.1/32 -j DROP\n-A INPUT -s 198.51.100.2/32 -j DROP\n-A INPUT -s 198.51.100.3/32 -j DROP\nCOMMIT\n"
	userRuleV6   = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n-A INPUT -s fd00:51::1/128 -j DROP\nCOMMIT\n"
)

// TestKernelSelect is the backend-choice matrix: IPTABLES_MODE (unset,
// legacy, nft, bogus) × what the node has. Detection must not create any
// table: kube-proxy's image, k3s and the next kproxy start count them.
func TestKernelSelect(t *testing.T) {
	for _, b := range Backends {
		for _, f := range Families {
			requireBinaries(t, b, f)
		}
	}
	type load struct {
		backend Backend
		family  Family
		rules   string
	}
	states := []struct {
		name       string
		loads      []load
		want       Backend
		wantReason string
	}{
		{name: "nothing", want: NFT, wantReason: "0 legacy rules vs 0 nft rules"},
		{
			name:  "kube-proxy and kubelet rules in legacy",
			loads: []load{{Legacy, IPv4, readFixture(t, "iptables-v4.save")}, {Legacy, IPv6, readFixture(t, "iptables-v6.save")}},
			// iptables-legacy-save prints filter first: its canary is found.
			want: Legacy, wantReason: "kubelet's KUBE-KUBELET-CANARY found in the iptables-legacy rules",
		},
		{
			name:  "kubelet canary in legacy IPv6 nat only",
			loads: []load{{Legacy, IPv6, canaryOnlyNA}, {NFT, IPv4, userRulesV4}},
			want:  Legacy, wantReason: "kubelet's KUBE-KUBELET-CANARY found in the ip6tables-legacy rules",
		},
		{
			name:  "kubelet hint in the nft mangle table",
			loads: []load{{NFT, IPv4, hintMangle}},
			want:  NFT, wantReason: "kubelet's KUBE-IPTABLES-HINT found in the iptables-nft mangle table",
		},
		{
			name:  "kubelet hint in the nft IPv6 mangle table, many legacy rules",
			loads: []load{{NFT, IPv6, hintMangle}, {Legacy, IPv4, userRulesV4}},
			want:  NFT, wantReason: "kubelet's KUBE-IPTABLES-HINT found in the ip6tables-nft mangle table",
		},
		{
			name:  "nft rules only",
			loads: []load{{NFT, IPv4, userRulesV4}, {NFT, IPv6, userRuleV6}},
			want:  NFT, wantReason: "0 legacy rules vs 4 nft rules",
		},
		{
			name:  "rules in both, more in legacy",
			loads: []load{{Legacy, IPv4, userRulesV4}, {Legacy, IPv6, userRuleV6}, {NFT, IPv6, userRuleV6}},
			want:  Legacy, wantReason: "4 legacy rules vs 1 nft rules",
		},
		{
			name:  "kubelet chains in both backends: nft is looked at first",
			loads: []load{{Legacy, IPv4, readFixture(t, "iptables-v4.save")}, {NFT, IPv4, hintMangle}},
			want:  NFT, wantReason: "kubelet's KUBE-IPTABLES-HINT found in the iptables-nft mangle table",
		},
	}
	envs := []struct {
		env        string
		want       Backend
		wantReason string
		wantErr    bool
	}{
		{env: ""},
		{env: "legacy", want: Legacy, wantReason: "IPTABLES_MODE=legacy"},
		{env: "nft", want: NFT, wantReason: "IPTABLES_MODE=nft"},
		{env: "bogus", wantErr: true},
	}
	for _, s := range states {
		for _, e := range envs {
			t.Run(fmt.Sprintf("%s/IPTABLES_MODE=%s", s.name, e.env), func(t *testing.T) {
				k := newKernelCase(t, Legacy, IPv4)
				for _, l := range s.loads {
					_, restore, _ := binaries(l.backend, l.family)
					k.run(t, l.rules, restore)
				}
				tables := k.tableList(t)
				got, reason, err := Select(context.Background(), e.env, k.opts()...)
				switch {
				case e.wantErr:
					if err == nil || !strings.Contains(err.Error(), `want "legacy" or "nft"`) {
						t.Errorf("err = %v, want one naming the allowed values", err)
					}
				case err != nil:
					t.Fatal(err)
				case e.env != "":
					if got != e.want || reason != e.wantReason {
						t.Errorf("Select = %s, %q; want %s, %q", got, reason, e.want, e.wantReason)
					}
				default:
					if got != s.want || reason != s.wantReason {
						t.Errorf("Select = %s, %q; want %s, %q", got, reason, s.want, s.wantReason)
					}
				}
				if d := cmp.Diff(tables, k.tableList(t)); d != "" {
					t.Errorf("tables changed by Select (-before +after):\n%s", d)
				}
			})
		}
	}
}

// TestKernelOtherBackendRules: kube-proxy's chains in the backend that was
// not chosen are reported, the kubelet's are not.
func TestKernelOtherBackendRules(t *testing.T) {
	requireBinaries(t, NFT, IPv4)
	k := newKernelCase(t, Legacy, IPv4)
	k.load(t, readFixture(t, "iptables-v4.save"))
	k.run(t, hintMangle, "ip6tables-legacy-restore")
	k.run(t, hintMangle, "iptables-nft-restore")

	got, err := OtherBackendRules(context.Background(), NFT, k.opts()...)
	if err != nil {
		t.Fatal(err)
	}
	_, chains, err := cleanupScript(readFixture(t, "iptables-v4.save"))
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, c := range chains {
		want = append(want, Leftover{Backend: Legacy, Family: IPv4, Chain: c}.String())
	}
	var gotS []string
	for _, l := range got {
		gotS = append(gotS, l.String())
	}
	slices.Sort(want)
	slices.Sort(gotS)
	if d := cmp.Diff(want, gotS); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	if got, err := OtherBackendRules(context.Background(), Legacy, k.opts()...); err != nil || len(got) != 0 {
		t.Errorf("nft has only the kubelet's chains: got %v, %v", got, err)
	}
}
