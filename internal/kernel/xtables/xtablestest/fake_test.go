package xtablestest

// Addresses: 10.96.0.0/16 service cluster IPs, 10.244.0.0/16 pod
// (endpoint) IPs, 203.0.113.0/24 external clients.

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
)

var ctx = context.Background()

// base is a small kube-proxy-like nat and filter ruleset.
const base = `*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
-A INPUT -j KUBE-SERVICES
-A KUBE-SERVICES -d 10.96.0.20/32 -p tcp -m comment --comment "default/empty:http has no endpoints" -j REJECT --reject-with icmp-port-unreachable
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SEP-AAAAAAAAAAAAAAAA - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-BBBBBBBBBBBBBBBB - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -j KUBE-POSTROUTING
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE --random-fully
-A KUBE-SEP-AAAAAAAAAAAAAAAA -s 10.244.0.2/32 -j KUBE-MARK-MASQ
-A KUBE-SEP-AAAAAAAAAAAAAAAA -p tcp -m tcp -j DNAT --to-destination 10.244.0.2:80
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-BBBBBBBBBBBBBBBB
-A KUBE-SVC-BBBBBBBBBBBBBBBB -j KUBE-SEP-AAAAAAAAAAAAAAAA
COMMIT
`

func loaded(t *testing.T, b xtables.Backend) *Fake {
	t.Helper()
	f := NewFake(b, xtables.IPv4)
	if err := f.Restore(ctx, []byte(base), xtables.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestFakeRoundTrip(t *testing.T) {
	for _, b := range xtables.Backends {
		t.Run(string(b), func(t *testing.T) {
			f := loaded(t, b)
			if d := cmp.Diff(base, f.Dump()); d != "" {
				t.Errorf("Dump differs from the input (-in +dump):\n%s", d)
			}
			// Save → Restore into a new Fake gives the same Save.
			g := NewFake(b, xtables.IPv4)
			for _, table := range []string{"filter", "nat"} {
				out, err := f.Save(ctx, table)
				if err != nil {
					t.Fatal(err)
				}
				if err := g.Restore(ctx, out, xtables.RestoreOptions{}); err != nil {
					t.Fatalf("restoring the saved %s table: %v", table, err)
				}
				again, err := g.Save(ctx, table)
				if err != nil {
					t.Fatal(err)
				}
				if d := cmp.Diff(string(out), string(again)); d != "" {
					t.Errorf("%s: Save→Restore→Save (-first +second):\n%s", table, d)
				}
			}
			if d := cmp.Diff([]string{"filter", "nat"}, g.Tables()); d != "" {
				t.Errorf("tables (-want +got):\n%s", d)
			}
		})
	}
}

func TestFakeRestoreSemantics(t *testing.T) {
	tests := []struct {
		name    string
		input   string
		noflush bool
		// want maps a table to its expected Save; tables not named are
		// expected unchanged from base.
		want map[string]string
	}{
		{
			name:  "without --noflush a named table is replaced; others stay",
			input: "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-NEW - [0:0]\n-A PREROUTING -j KUBE-NEW\nCOMMIT\n",
			want: map[string]string{"nat": `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-NEW - [0:0]
-A PREROUTING -j KUBE-NEW
COMMIT
`},
		},
		{
			name:  "built-in policies survive a flushing restore that does not declare them",
			input: "*filter\n:KUBE-X - [0:0]\nCOMMIT\n",
			want: map[string]string{"filter": `*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-X - [0:0]
COMMIT
`},
		},
		{
			name: "--noflush: a declared user chain is flushed, undeclared ones and built-in chains keep their rules",
			input: `*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-BBBBBBBBBBBBBBBB - [0:0]
:KUBE-SEP-AAAAAAAAAAAAAAAA - [0:0]
:KUBE-SEP-CCCCCCCCCCCCCCCC - [0:0]
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-BBBBBBBBBBBBBBBB
-A KUBE-SVC-BBBBBBBBBBBBBBBB -j KUBE-SEP-CCCCCCCCCCCCCCCC
-A KUBE-SEP-CCCCCCCCCCCCCCCC -p tcp -m tcp -j DNAT --to-destination 10.244.0.3:80
-X KUBE-SEP-AAAAAAAAAAAAAAAA
COMMIT
`,
			noflush: true,
			want: map[string]string{"nat": `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SEP-CCCCCCCCCCCCCCCC - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-BBBBBBBBBBBBBBBB - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -j KUBE-POSTROUTING
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE --random-fully
-A KUBE-SEP-CCCCCCCCCCCCCCCC -p tcp -m tcp -j DNAT --to-destination 10.244.0.3:80
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-BBBBBBBBBBBBBBBB
-A KUBE-SVC-BBBBBBBBBBBBBBBB -j KUBE-SEP-CCCCCCCCCCCCCCCC
COMMIT
`},
		},
		{
			name: "-I, -D by rule and by number, -N, -P, -F",
			input: `*filter
-I INPUT -s 203.0.113.1/32 -j DROP
-I INPUT 2 -s 203.0.113.2/32 -j DROP
-A INPUT -s 203.0.113.3/32 -j DROP
-D INPUT -j KUBE-SERVICES
-D INPUT 1
-N USER-CHAIN
-A USER-CHAIN -j RETURN
-P FORWARD ACCEPT
-F KUBE-SERVICES
COMMIT
`,
			noflush: true,
			want: map[string]string{"filter": `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:USER-CHAIN - [0:0]
-A INPUT -s 203.0.113.2/32 -j DROP
-A INPUT -s 203.0.113.3/32 -j DROP
-A USER-CHAIN -j RETURN
COMMIT
`},
		},
		{
			name:    "--noflush on a table that does not exist creates it",
			input:   "*mangle\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n",
			noflush: true,
			want: map[string]string{"mangle": `*mangle
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-PROXY-CANARY - [0:0]
COMMIT
`},
		},
		{
			name:    "flush then delete in one restore; comments and blank lines are skipped",
			input:   "# kproxy\n\n*nat\n-D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n-D OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n-F KUBE-SERVICES\n-X KUBE-SERVICES\nCOMMIT\n",
			noflush: true,
			want: map[string]string{"nat": `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SEP-AAAAAAAAAAAAAAAA - [0:0]
:KUBE-SVC-BBBBBBBBBBBBBBBB - [0:0]
-A POSTROUTING -j KUBE-POSTROUTING
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE --random-fully
-A KUBE-SEP-AAAAAAAAAAAAAAAA -s 10.244.0.2/32 -j KUBE-MARK-MASQ
-A KUBE-SEP-AAAAAAAAAAAAAAAA -p tcp -m tcp -j DNAT --to-destination 10.244.0.2:80
-A KUBE-SVC-BBBBBBBBBBBBBBBB -j KUBE-SEP-AAAAAAAAAAAAAAAA
COMMIT
`},
		},
		{
			name:    "comments are quoted as iptables-save quotes them",
			input:   "*filter\n-A INPUT -m comment --comment ns/svc:port -j ACCEPT\n-A INPUT -m comment --comment plain-word_1 -j ACCEPT\n-A INPUT -m comment --comment \"say \\\"hi\\\"\" -j ACCEPT\nCOMMIT\n",
			noflush: true,
			want: map[string]string{"filter": `*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
-A INPUT -j KUBE-SERVICES
-A INPUT -m comment --comment "ns/svc:port" -j ACCEPT
-A INPUT -m comment --comment plain-word_1 -j ACCEPT
-A INPUT -m comment --comment "say \"hi\"" -j ACCEPT
-A KUBE-SERVICES -d 10.96.0.20/32 -p tcp -m comment --comment "default/empty:http has no endpoints" -j REJECT --reject-with icmp-port-unreachable
COMMIT
`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := loaded(t, xtables.Legacy)
			before := saves(t, f)
			if err := f.Restore(ctx, []byte(tc.input), xtables.RestoreOptions{NoFlush: tc.noflush}); err != nil {
				t.Fatal(err)
			}
			after := saves(t, f)
			for _, table := range xtables.Tables {
				want, ok := tc.want[table]
				if !ok {
					want = before[table]
				}
				if d := cmp.Diff(want, after[table]); d != "" {
					t.Errorf("table %s (-want +got):\n%s", table, d)
				}
			}
		})
	}
}

// saves dumps every existing table without creating any.
func saves(t *testing.T, f *Fake) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, table := range f.Tables() {
		b, err := f.Save(ctx, table)
		if err != nil {
			t.Fatal(err)
		}
		out[table] = string(b)
	}
	return out
}

func TestFakeRejects(t *testing.T) {
	tests := []struct {
		name     string
		input    string
		noflush  bool
		wantLine int
		wantErr  string
	}{
		{name: "unknown table", input: "*bogus\nCOMMIT\n", wantLine: 1, wantErr: "unable to initialize table 'bogus'"},
		{name: "missing COMMIT", input: "*nat\n:KUBE-X - [0:0]\n", wantLine: 3, wantErr: "COMMIT expected"},
		{name: "new table before COMMIT", input: "*nat\n*filter\nCOMMIT\n", wantLine: 2, wantErr: "COMMIT expected"},
		{name: "rule outside a table", input: "-A INPUT -j ACCEPT\n", wantLine: 1, wantErr: "outside a table"},
		{name: "rule in an undeclared chain", input: "*nat\n-A KUBE-NOPE -j ACCEPT\nCOMMIT\n", wantLine: 2, wantErr: "chain 'KUBE-NOPE' does not exist"},
		{
			name:     "rule in a chain of the flushed table (it was declared before, not now)",
			input:    "*nat\n-A KUBE-SERVICES -j ACCEPT\nCOMMIT\n",
			wantLine: 2, wantErr: "chain 'KUBE-SERVICES' does not exist",
		},
		{name: "jump to a chain that does not exist", input: "*nat\n:KUBE-A - [0:0]\n-A KUBE-A -j KUBE-B\nCOMMIT\n", noflush: true, wantLine: 3, wantErr: "couldn't load target `KUBE-B'"},
		{name: "jump to a chain declared later", input: "*nat\n:KUBE-A - [0:0]\n-A KUBE-A -j KUBE-B\n:KUBE-B - [0:0]\nCOMMIT\n", wantLine: 3, wantErr: "couldn't load target `KUBE-B'"},
		{name: "jump to a chain of another table", input: "*filter\n-A INPUT -j KUBE-MARK-MASQ\nCOMMIT\n", noflush: true, wantLine: 2, wantErr: "couldn't load target"},
		{name: "jump to a built-in chain", input: "*filter\n-A FORWARD -j INPUT\nCOMMIT\n", noflush: true, wantLine: 2, wantErr: "built-in chain"},
		{name: "goto a verdict", input: "*filter\n-A FORWARD -g ACCEPT\nCOMMIT\n", noflush: true, wantLine: 2, wantErr: "not a chain"},
		{
			name:     "deleting a chain still referenced",
			input:    "*nat\n:KUBE-SVC-BBBBBBBBBBBBBBBB - [0:0]\n-X KUBE-SVC-BBBBBBBBBBBBBBBB\nCOMMIT\n",
			noflush:  true,
			wantLine: 3, wantErr: "Too many links",
		},
		{name: "deleting a chain with rules", input: "*nat\n-X KUBE-SEP-AAAAAAAAAAAAAAAA\nCOMMIT\n", noflush: true, wantLine: 2, wantErr: "Directory not empty"},
		{name: "deleting a built-in chain", input: "*nat\n-X OUTPUT\nCOMMIT\n", noflush: true, wantLine: 2, wantErr: "built-in"},
		{name: "deleting a missing chain", input: "*nat\n-X KUBE-GONE\nCOMMIT\n", noflush: true, wantLine: 2, wantErr: "does not exist"},
		{name: "deleting a rule that does not exist", input: "*nat\n-D PREROUTING -j KUBE-SERVICES\nCOMMIT\n", noflush: true, wantLine: 2, wantErr: "Bad rule"},
		{name: "a user chain declared twice in a flushing restore", input: "*nat\n:KUBE-A - [0:0]\n:KUBE-A - [0:0]\nCOMMIT\n", wantLine: 3, wantErr: "File exists"},
		{name: "a user chain with a policy", input: "*nat\n:KUBE-A ACCEPT [0:0]\nCOMMIT\n", wantLine: 2, wantErr: "can't set policy"},
		{name: "a bad built-in policy", input: "*filter\n:INPUT REJECT [0:0]\nCOMMIT\n", wantLine: 2, wantErr: "bad policy"},
		{name: "a chain name too long", input: "*nat\n:KUBE-SVC-ABCDEFGHIJKLMNOPQRSTU - [0:0]\nCOMMIT\n", wantLine: 2, wantErr: "28 chars max"},
		{name: "-t inside restore input", input: "*nat\n-t nat -A PREROUTING -j ACCEPT\nCOMMIT\n", wantLine: 2, wantErr: "-t option"},
		{name: "insert position too big", input: "*nat\n-I PREROUTING 5 -j ACCEPT\nCOMMIT\n", noflush: true, wantLine: 2, wantErr: "too big"},
		{name: "DNAT outside nat", input: "*filter\n-A INPUT -j DNAT --to-destination 10.244.0.2\nCOMMIT\n", noflush: true, wantLine: 2, wantErr: "only valid in table nat"},
		{name: "REJECT in nat", input: "*nat\n-A PREROUTING -j REJECT\nCOMMIT\n", noflush: true, wantLine: 2, wantErr: "only valid in table filter"},
		{
			name:     "DNAT reachable from POSTROUTING (kernel check at COMMIT)",
			input:    "*nat\n-A POSTROUTING -j KUBE-SEP-AAAAAAAAAAAAAAAA\nCOMMIT\n",
			noflush:  true,
			wantLine: 3, wantErr: "reached from hook POSTROUTING",
		},
		{name: "MASQUERADE in PREROUTING", input: "*nat\n-A PREROUTING -j MASQUERADE\nCOMMIT\n", noflush: true, wantLine: 3, wantErr: "reached from hook PREROUTING"},
		{
			name:     "loop of jumps reachable from INPUT",
			input:    "*filter\n:KUBE-A - [0:0]\n:KUBE-B - [0:0]\n-A KUBE-A -j KUBE-B\n-A KUBE-B -j KUBE-A\n-A INPUT -j KUBE-A\nCOMMIT\n",
			noflush:  true,
			wantLine: 7, wantErr: "loop",
		},
		{
			name:     "loop of jumps reached through a chain",
			input:    "*filter\n:KUBE-A - [0:0]\n:KUBE-B - [0:0]\n-A KUBE-A -j KUBE-B\n-A KUBE-B -j KUBE-A\n-A INPUT -j KUBE-SERVICES\n-A KUBE-SERVICES -j KUBE-B\nCOMMIT\n",
			noflush:  true,
			wantLine: 8, wantErr: "loop",
		},
		{name: "unknown command", input: "*nat\n-E KUBE-SERVICES KUBE-SVCS\nCOMMIT\n", noflush: true, wantLine: 2, wantErr: "unknown command"},
		{name: "garbage", input: "*nat\nhello\nCOMMIT\n", noflush: true, wantLine: 2, wantErr: "unexpected"},
		{
			name:     "a later table fails: the whole call changes nothing",
			input:    "*filter\n:KUBE-NEW - [0:0]\nCOMMIT\n*nat\n-A KUBE-NOPE -j ACCEPT\nCOMMIT\n",
			wantLine: 5, wantErr: "does not exist",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := loaded(t, xtables.NFT)
			f.ClearRestores()
			before := f.Dump()
			err := f.Restore(ctx, []byte(tc.input), xtables.RestoreOptions{NoFlush: tc.noflush})
			var re *xtables.RestoreError
			if !errors.As(err, &re) {
				t.Fatalf("err = %v, want a *xtables.RestoreError", err)
			}
			if !strings.Contains(re.Error(), tc.wantErr) {
				t.Errorf("err = %v, want it to contain %q", err, tc.wantErr)
			}
			if re.Line != tc.wantLine {
				t.Errorf("line = %d, want %d (%v)", re.Line, tc.wantLine, err)
			}
			if re.Backend != xtables.NFT || re.Family != xtables.IPv4 {
				t.Errorf("error names %s %s", re.Backend, re.Family)
			}
			if d := cmp.Diff(before, f.Dump()); d != "" {
				t.Errorf("state changed by a failed restore (-before +after):\n%s", d)
			}
			log := f.Restores()
			if len(log) != 1 || string(log[0].Data) != tc.input || log[0].NoFlush != tc.noflush || log[0].Err != err {
				t.Errorf("log = %+v, want the one failed call", log)
			}
		})
	}
}

func TestFakeCommitPerTable(t *testing.T) {
	f := loaded(t, xtables.Legacy)
	f.CommitPerTable = true
	in := "*filter\n:KUBE-NEW - [0:0]\nCOMMIT\n*nat\n-A KUBE-NOPE -j ACCEPT\nCOMMIT\n"
	if err := f.Restore(ctx, []byte(in), xtables.RestoreOptions{NoFlush: true}); err == nil {
		t.Fatal("restore succeeded")
	}
	// As iptables-restore: the filter table was committed before nat failed.
	if got := f.Chains("filter"); !strings.Contains(strings.Join(got, " "), "KUBE-NEW") {
		t.Errorf("filter chains = %v, want KUBE-NEW committed", got)
	}
}

func TestFakeSaveCreates(t *testing.T) {
	for _, tc := range []struct {
		backend xtables.Backend
		want    []string
	}{
		{xtables.Legacy, []string{"mangle"}}, // the kernel loads the table
		{xtables.NFT, nil},                   // iptables-nft-save only prints
	} {
		f := NewFake(tc.backend, xtables.IPv6)
		out, err := f.Save(ctx, "mangle")
		if err != nil {
			t.Fatal(err)
		}
		want := "*mangle\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n"
		if d := cmp.Diff(want, string(out)); d != "" {
			t.Errorf("%s: Save (-want +got):\n%s", tc.backend, d)
		}
		if d := cmp.Diff(tc.want, f.Tables()); d != "" {
			t.Errorf("%s: tables after Save (-want +got):\n%s", tc.backend, d)
		}
		if _, err := f.Save(ctx, "bogus"); err == nil {
			t.Errorf("%s: Save of an unknown table succeeded", tc.backend)
		}
	}
}

func TestFakeHookAndStats(t *testing.T) {
	f := loaded(t, xtables.Legacy)
	before := f.Dump()
	f.RestoreHook = func([]byte, xtables.RestoreOptions) error {
		return &xtables.RestoreError{Backend: xtables.Legacy, Family: xtables.IPv4, Err: xtables.ErrLockTimeout}
	}
	err := f.Restore(ctx, []byte("*filter\nCOMMIT\n"), xtables.RestoreOptions{})
	if !errors.Is(err, xtables.ErrLockTimeout) {
		t.Errorf("err = %v, want ErrLockTimeout", err)
	}
	if f.Dump() != before {
		t.Error("state changed by a hooked failure")
	}
	f.RestoreHook = nil
	f.Stats = xtables.RestoreStats{LockWait: 3}
	st, err := f.RestoreWithStats(ctx, []byte("*filter\nCOMMIT\n"), xtables.RestoreOptions{})
	if err != nil || st.LockWait != 3 {
		t.Errorf("RestoreWithStats = %+v, %v", st, err)
	}
	if v, _ := f.Version(ctx); v != "1.8.9" {
		t.Errorf("Version = %q", v)
	}
	if got := f.Rules("filter", "INPUT"); len(got) != 0 {
		t.Errorf("INPUT after a flushing restore = %q, want no rules", got)
	}
	if f.Backend() != xtables.Legacy || f.Family() != xtables.IPv4 {
		t.Errorf("Backend/Family = %s/%s", f.Backend(), f.Family())
	}
}
