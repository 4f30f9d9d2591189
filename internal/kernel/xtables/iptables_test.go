package xtables

// Unit tests of the iptables-mode runner: scripted argv and stdin.
// Addresses: see leftovers_test.go.

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kproxy/kproxy/internal/kernel/execer/execertest"
)

const restoreInput = `*nat
:KUBE-SERVICES - [0:0]
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m tcp --dport 53 -j ACCEPT
COMMIT
`

// fakeClock advances by step at every reading.
func fakeClock(step time.Duration) func() time.Time {
	t := time.Unix(1e9, 0)
	return func() time.Time {
		t = t.Add(step)
		return t
	}
}

func TestNewMissingBinaries(t *testing.T) {
	tests := []struct {
		backend Backend
		family  Family
		missing []string
		want    string
	}{
		{Legacy, IPv4, []string{"iptables-legacy"}, "iptables-legacy not found"},
		{NFT, IPv6, []string{"ip6tables-nft", "ip6tables-nft-save", "ip6tables-nft-restore"}, "ip6tables-nft, ip6tables-nft-save and ip6tables-nft-restore not found"},
		{NFT, IPv4, []string{"iptables-nft-restore"}, "iptables-nft-restore not found"},
	}
	for _, tc := range tests {
		x := &execertest.Script{T: t, Missing: map[string]bool{}}
		for _, m := range tc.missing {
			x.Missing[m] = true
		}
		_, err := New(tc.backend, tc.family, withExecer(x))
		if !errors.Is(err, ErrNotInstalled) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %s: err = %v, want ErrNotInstalled saying %q", tc.backend, tc.family, err, tc.want)
		}
	}
	if _, err := New("iptables", IPv4, withExecer(&execertest.Script{T: t})); err == nil || errors.Is(err, ErrNotInstalled) {
		t.Errorf("unknown backend: err = %v, want a plain error", err)
	}
}

func TestRestore(t *testing.T) {
	ns := []string{"ip", "netns", "exec", "kpt-x"}
	tests := []struct {
		name      string
		backend   Backend
		family    Family
		opts      RestoreOptions
		lockWait  time.Duration // option; 0 = default
		probe     time.Duration // what the lock probe reports
		probeErr  error
		call      *execertest.Call // nil: restore must not run
		wantStats RestoreStats
		wantErr   error
		wantLine  int
		wantMsg   string
	}{
		{
			name: "legacy IPv4 flushing: bounded lock wait", backend: Legacy, family: IPv4,
			call:      &execertest.Call{Argv: append(ns, "/usr/sbin/iptables-legacy-restore", "-w", "5"), Stdin: restoreInput},
			wantStats: RestoreStats{Duration: 10 * time.Millisecond},
		},
		{
			name: "legacy IPv6 --noflush, lock wait rounded up to whole seconds", backend: Legacy, family: IPv6,
			opts: RestoreOptions{NoFlush: true}, lockWait: 1500 * time.Millisecond, probe: 300 * time.Millisecond,
			call:      &execertest.Call{Argv: append(ns, "/usr/sbin/ip6tables-legacy-restore", "--noflush", "-w", "2"), Stdin: restoreInput},
			wantStats: RestoreStats{Duration: 10 * time.Millisecond, LockWait: 300 * time.Millisecond},
		},
		{
			name: "nft takes no lock", backend: NFT, family: IPv4, opts: RestoreOptions{NoFlush: true},
			call:      &execertest.Call{Argv: append(ns, "/usr/sbin/iptables-nft-restore", "--noflush"), Stdin: restoreInput},
			wantStats: RestoreStats{Duration: 10 * time.Millisecond},
		},
		{
			name: "legacy lock timeout reported by iptables", backend: Legacy, family: IPv4,
			call: &execertest.Call{Argv: append(ns, "/usr/sbin/iptables-legacy-restore", "-w", "5"), Stdin: restoreInput,
				Stderr: "Another app is currently holding the xtables lock. Stopped waiting after 5s.\n"},
			wantStats: RestoreStats{Duration: 10 * time.Millisecond},
			wantErr:   ErrLockTimeout, wantMsg: "Stopped waiting after 5s",
		},
		{
			name: "lock held longer than the bound: restore not run", backend: Legacy, family: IPv4,
			probe: 5 * time.Second, probeErr: ErrLockTimeout,
			wantStats: RestoreStats{Duration: 10 * time.Millisecond, LockWait: 5 * time.Second},
			wantErr:   ErrLockTimeout,
		},
		{
			name: "legacy parse error names the line", backend: Legacy, family: IPv4,
			call: &execertest.Call{Argv: append(ns, "/usr/sbin/iptables-legacy-restore", "-w", "5"), Stdin: restoreInput,
				Stderr: "iptables-restore v1.8.9 (legacy): Couldn't load target `KUBE-B':No such file or directory\n\nError occurred at line: 3\nTry `iptables-restore -h' or 'iptables-restore --help' for more information.\n"},
			wantStats: RestoreStats{Duration: 10 * time.Millisecond},
			wantLine:  3, wantMsg: "at line 3: iptables-restore v1.8.9 (legacy): Couldn't load target `KUBE-B':No such file or directory; Error occurred at line: 3",
		},
		{
			name: "kernel rejection at COMMIT", backend: NFT, family: IPv6,
			call: &execertest.Call{Argv: append(ns, "/usr/sbin/ip6tables-nft-restore"), Stdin: restoreInput,
				Stderr: "ip6tables-nft-restore: line 4 failed: No chain/target/match by that name.\n"},
			wantStats: RestoreStats{Duration: 10 * time.Millisecond},
			wantLine:  4, wantMsg: "nft IPv6 restore failed at line 4",
		},
		{
			name: "nft batch error", backend: NFT, family: IPv4,
			call: &execertest.Call{Argv: append(ns, "/usr/sbin/iptables-nft-restore"), Stdin: restoreInput,
				Stderr: "iptables-nft-restore v1.8.9 (nf_tables): \nline 2: CHAIN_DEL failed (Device or resource busy): chain FOO\n"},
			wantStats: RestoreStats{Duration: 10 * time.Millisecond},
			wantLine:  2, wantMsg: "CHAIN_DEL failed",
		},
		{
			name: "missing COMMIT", backend: NFT, family: IPv4,
			call: &execertest.Call{Argv: append(ns, "/usr/sbin/iptables-nft-restore"), Stdin: restoreInput,
				Stderr: "iptables-nft-restore: COMMIT expected at line 5\n"},
			wantStats: RestoreStats{Duration: 10 * time.Millisecond},
			wantLine:  5,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x := &execertest.Script{T: t}
			if tc.call != nil {
				x.Calls = []execertest.Call{*tc.call}
			}
			var probed time.Duration
			opts := []Option{
				withExecer(x), WithCommandPrefix(ns...), withClock(fakeClock(10 * time.Millisecond)),
				withLockProbe(func(_ context.Context, max time.Duration) (time.Duration, error) {
					probed = max
					return tc.probe, tc.probeErr
				}),
			}
			if tc.lockWait > 0 {
				opts = append(opts, WithLockWait(tc.lockWait))
			}
			ipt, err := New(tc.backend, tc.family, opts...)
			if err != nil {
				t.Fatal(err)
			}
			if ipt.Backend() != tc.backend || ipt.Family() != tc.family {
				t.Errorf("Backend/Family = %s/%s", ipt.Backend(), ipt.Family())
			}
			st, err := ipt.RestoreWithStats(context.Background(), []byte(restoreInput), tc.opts)
			x.Done()
			if d := cmp.Diff(tc.wantStats, st); d != "" {
				t.Errorf("stats (-want +got):\n%s", d)
			}
			wantProbe := time.Duration(0)
			if tc.backend == Legacy {
				wantProbe = DefaultLockWait
				if tc.lockWait > 0 {
					wantProbe = tc.lockWait
				}
			}
			if probed != wantProbe {
				t.Errorf("lock probe bound = %v, want %v", probed, wantProbe)
			}
			failing := tc.wantErr != nil || tc.wantLine != 0 || tc.wantMsg != ""
			if !failing {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var re *RestoreError
			if !errors.As(err, &re) {
				t.Fatalf("err = %v, want a *RestoreError", err)
			}
			if re.Backend != tc.backend || re.Family != tc.family || re.Line != tc.wantLine {
				t.Errorf("RestoreError = %s %s line %d, want %s %s line %d", re.Backend, re.Family, re.Line, tc.backend, tc.family, tc.wantLine)
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("err = %v, want it to match %v", err, tc.wantErr)
			}
			if tc.wantErr == nil && errors.Is(err, ErrLockTimeout) {
				t.Errorf("err = %v matches ErrLockTimeout", err)
			}
			// The proxy's failure isolation asks the error whose fault it
			// was: a lock held past the wait is the host's, a refused line
			// the input's.
			if got, want := re.HostFault(), errors.Is(tc.wantErr, ErrLockTimeout); got != want {
				t.Errorf("HostFault() = %v, want %v (err %v)", got, want, err)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("err = %q, want it to contain %q", err, tc.wantMsg)
			}
		})
	}
}

func TestRestoreWithoutStats(t *testing.T) {
	x := &execertest.Script{T: t, Calls: []execertest.Call{
		{Argv: []string{"/usr/sbin/iptables-nft-restore", "--noflush"}, Stdin: restoreInput},
	}}
	ipt, err := New(NFT, IPv4, withExecer(x))
	if err != nil {
		t.Fatal(err)
	}
	if err := ipt.Restore(context.Background(), []byte(restoreInput), RestoreOptions{NoFlush: true}); err != nil {
		t.Fatal(err)
	}
	x.Done()
}

func TestSave(t *testing.T) {
	const out = "*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n"
	x := &execertest.Script{T: t, Calls: []execertest.Call{
		{Argv: []string{"/usr/sbin/ip6tables-legacy-save", "-t", "nat"}, Stdout: out},
		{Argv: []string{"/usr/sbin/ip6tables-legacy-save", "-t", "filter"}, Stderr: "ip6tables-save: Permission denied (you must be root)"},
	}}
	ipt, err := New(Legacy, IPv6, withExecer(x))
	if err != nil {
		t.Fatal(err)
	}
	got, err := ipt.Save(context.Background(), "nat")
	if err != nil || string(got) != out {
		t.Errorf("Save(nat) = %q, %v; want %q", got, err, out)
	}
	if _, err := ipt.Save(context.Background(), "filter"); err == nil || !strings.Contains(err.Error(), "saving legacy IPv6 table filter") {
		t.Errorf("Save(filter) err = %v", err)
	}
	// An unknown table runs nothing.
	if _, err := ipt.Save(context.Background(), "kube-proxy"); err == nil || !strings.Contains(err.Error(), "unknown table") {
		t.Errorf("Save(kube-proxy) err = %v", err)
	}
	x.Done()
}

func TestVersion(t *testing.T) {
	tests := []struct {
		backend Backend
		family  Family
		out     string
		want    string
		wantErr error
		msg     string
	}{
		{backend: Legacy, family: IPv4, out: "iptables v1.8.9 (legacy)\n", want: "1.8.9"},
		{backend: NFT, family: IPv6, out: "ip6tables v1.8.10 (nf_tables)\n", want: "1.8.10"},
		{backend: NFT, family: IPv4, out: "iptables v1.8.4 (nf_tables)\n", want: "1.8.4"},
		{backend: NFT, family: IPv4, out: "iptables v1.8.3 (nf_tables)\n", want: "1.8.3", wantErr: ErrUnsupportedVersion, msg: "iptables 1.8.3 (nft backend); kproxy needs 1.8.4 or newer"},
		{backend: Legacy, family: IPv4, out: "iptables v1.6.1\n", want: "1.6.1", wantErr: ErrUnsupportedVersion, msg: "needs 1.8.4"},
		{backend: Legacy, family: IPv4, out: "iptables v1.8.9 (nf_tables)\n", want: "1.8.9", wantErr: ErrUnsupportedVersion, msg: `reports backend "nf_tables", want "legacy"`},
		{backend: NFT, family: IPv4, out: "iptables v2.0.0 (nf_tables)\n", want: "2.0.0"},
		{backend: NFT, family: IPv4, out: "something else\n", msg: "cannot read the iptables version"},
	}
	for _, tc := range tests {
		cmd, _ := command(tc.backend, tc.family)
		x := &execertest.Script{T: t, Calls: []execertest.Call{{Argv: []string{"/usr/sbin/" + cmd, "--version"}, Stdout: tc.out}}}
		ipt, err := New(tc.backend, tc.family, withExecer(x))
		if err != nil {
			t.Fatal(err)
		}
		got, err := ipt.Version(context.Background())
		x.Done()
		if got != tc.want {
			t.Errorf("%q: version %q, want %q", tc.out, got, tc.want)
		}
		switch {
		case tc.msg == "" && err != nil:
			t.Errorf("%q: %v", tc.out, err)
		case tc.msg != "" && (err == nil || !strings.Contains(err.Error(), tc.msg)):
			t.Errorf("%q: err = %v, want it to say %q", tc.out, err, tc.msg)
		case tc.wantErr != nil && !errors.Is(err, tc.wantErr):
			t.Errorf("%q: err = %v, want %v", tc.out, err, tc.wantErr)
		}
	}
}

func TestWaitForLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "xtables.lock")
	ctx := context.Background()
	// Free: no wait.
	if w, err := waitForLock(ctx, path, time.Second, time.Now); w != 0 || err != nil {
		t.Errorf("free lock: %v, %v", w, err)
	}
	// flock locks belong to the open file: a second open of the same file
	// in this process conflicts with it, as another program would.
	holder, err := os.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if err := syscall.Flock(int(holder.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	w, err := waitForLock(ctx, path, 100*time.Millisecond, time.Now)
	if !errors.Is(err, ErrLockTimeout) || w < 100*time.Millisecond {
		t.Errorf("held lock: waited %v, err %v; want ErrLockTimeout after 100ms", w, err)
	}
	go func() {
		time.Sleep(80 * time.Millisecond)
		syscall.Flock(int(holder.Fd()), syscall.LOCK_UN)
	}()
	w, err = waitForLock(ctx, path, 5*time.Second, time.Now)
	if err != nil || w < 60*time.Millisecond || w > 3*time.Second {
		t.Errorf("lock released after 80ms: waited %v, err %v", w, err)
	}
	// A lock file that cannot be created is not measured.
	if w, err := waitForLock(ctx, filepath.Join(t.TempDir(), "no", "such", "dir"), time.Second, time.Now); w != 0 || err != nil {
		t.Errorf("missing directory: %v, %v", w, err)
	}
}

func TestSyntax(t *testing.T) {
	tests := []struct {
		line   string
		fields []string
		joined string
	}{
		{`-A X -m comment --comment "a b" -j ACCEPT`, []string{"-A", "X", "-m", "comment", "--comment", "a b", "-j", "ACCEPT"}, ""},
		{`-A X --comment "say \"hi\" \\o/"`, []string{"-A", "X", "--comment", `say "hi" \o/`}, ""},
		{"-A  X\t-j  DROP", []string{"-A", "X", "-j", "DROP"}, "-A X -j DROP"},
		{`-A X --comment ""`, []string{"-A", "X", "--comment", ""}, ""},
	}
	for _, tc := range tests {
		got, err := Fields(tc.line)
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(tc.fields, got); d != "" {
			t.Errorf("Fields(%q) (-want +got):\n%s", tc.line, d)
		}
		want := tc.joined
		if want == "" {
			want = tc.line
		}
		// Quote reads back: each field quoted as needed, single spaces.
		quoted := make([]string, len(got))
		for i, f := range got {
			quoted[i] = Quote(f)
		}
		if j := strings.Join(quoted, " "); j != want {
			t.Errorf("quoted fields = %q, want %q", j, want)
		}
	}
	if _, err := Fields(`-A X --comment "open`); err == nil {
		t.Error("unterminated quote accepted")
	}
	// Tokenize marks quoted words: a quoted "!" or number is a word, not
	// a negation or a rule number. A quote inside a word groups blanks
	// into it; outside quotes a backslash is kept.
	toks, err := Tokenize(`-D X "1" ! "!" a"b c"d e\f` + "\rg")
	if err != nil {
		t.Fatal(err)
	}
	want := []Token{{Text: "-D"}, {Text: "X"}, {Text: "1", Quoted: true}, {Text: "!"}, {Text: "!", Quoted: true}, {Text: "ab cd", Quoted: true}, {Text: `e\f` + "\rg"}}
	if d := cmp.Diff(want, toks); d != "" {
		t.Errorf("Tokenize (-want +got):\n%s", d)
	}
}
