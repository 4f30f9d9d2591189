package nft

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/kernel/execer/execertest"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

func testTx() *Transaction {
	tx := NewTransaction(IPv4, "kube-proxy")
	tx.Add(&Table{})
	tx.Add(&Chain{Name: "services"})
	tx.Add(&Rule{Chain: "services", Stmts: []Stmt{Verdict{Kind: Goto, Chain: "missing"}}})
	return tx
}

func TestExecApply(t *testing.T) {
	nftArgv := []string{"ip", "netns", "exec", "ns1", "/usr/sbin/nft", "-f", "-"}
	tx := testTx()
	cases := []struct {
		name   string
		stderr string
		check  func(t *testing.T, err error)
	}{
		{
			name: "success",
			check: func(t *testing.T, err error) {
				if err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "kernel rejects one operation",
			stderr: "/dev/stdin:3:1-42: Error: Could not process rule: No such file or directory\n" +
				"add rule ip kube-proxy services goto missing\n^^^^^^^^^^^^^^^^^^^^^^^^^\n",
			check: func(t *testing.T, err error) {
				if !errors.Is(err, unix.ENOENT) {
					t.Errorf("got %v, want ENOENT", err)
				}
				var oe *OpError
				if !errors.As(err, &oe) || oe.Index != 2 || oe.Op != tx.OpText(2) {
					t.Fatalf("got %#v, want operation 2", err)
				}
				if !strings.Contains(err.Error(), "3 operations") || !strings.Contains(err.Error(), "goto missing") {
					t.Errorf("message %q does not name the transaction size and the operation", err)
				}
			},
		},
		{
			name: "two errors",
			stderr: "/dev/stdin:2:1-10: Error: Could not process rule: Device or resource busy\nx\n^\n" +
				"/dev/stdin:3:1-10: Error: Could not process rule: File exists\nx\n^\n",
			check: func(t *testing.T, err error) {
				if !errors.Is(err, unix.EBUSY) || !errors.Is(err, unix.EEXIST) {
					t.Errorf("got %v, want EBUSY and EEXIST", err)
				}
			},
		},
		{
			name:   "nft's own check",
			stderr: "/dev/stdin:3:33-39: Error: No such file or directory; did you mean chain ‘services’ in table ip ‘kube-proxy’?\n",
			check: func(t *testing.T, err error) {
				var oe *OpError
				if !errors.As(err, &oe) || oe.Index != 2 || !errors.Is(err, unix.ENOENT) {
					t.Errorf("got %v, want ENOENT at operation 2", err)
				}
			},
		},
		{
			name:   "syntax error",
			stderr: "/dev/stdin:2:5-9: Error: syntax error, unexpected string\n",
			check: func(t *testing.T, err error) {
				var oe *OpError
				if !errors.As(err, &oe) || oe.Index != 1 || !strings.Contains(err.Error(), "syntax error") {
					t.Errorf("got %v, want a syntax error at operation 1", err)
				}
			},
		},
		{
			name:   "no nf_tables in the kernel",
			stderr: "netlink: Error: cache initialization failed: Protocol not supported\n",
			check: func(t *testing.T, err error) {
				if !errors.Is(err, ErrNotSupported) {
					t.Errorf("got %v, want ErrNotSupported", err)
				}
			},
		},
		{
			name:   "unparsed failure",
			stderr: "Segmentation fault\n",
			check: func(t *testing.T, err error) {
				if err == nil || !strings.Contains(err.Error(), "Segmentation fault") {
					t.Errorf("got %v, want the stderr text", err)
				}
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x := &execertest.Script{T: t, Calls: []execertest.Call{{Argv: nftArgv, Stdin: tx.String(), Stderr: c.stderr}}}
			e, err := NewExec("", WithCommandPrefix("ip", "netns", "exec", "ns1"), withExecer(x))
			if err != nil {
				t.Fatal(err)
			}
			c.check(t, e.Apply(context.Background(), tx))
			x.Done()
		})
	}
}

func TestExecEmptyTransactionRunsNothing(t *testing.T) {
	x := &execertest.Script{T: t}
	e, err := NewExec("/sbin/nft", withExecer(x))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Apply(context.Background(), NewTransaction(IPv4, "t")); err != nil {
		t.Fatal(err)
	}
	x.Done()
}

func TestExecMissingBinary(t *testing.T) {
	x := &execertest.Script{T: t, Missing: map[string]bool{"nft": true}}
	_, err := NewExec("", withExecer(x))
	if !errors.Is(err, ErrNotSupported) || !errors.Is(err, exec.ErrNotFound) || !strings.Contains(err.Error(), `"nft"`) {
		t.Errorf("got %v, want ErrNotSupported and exec.ErrNotFound naming nft", err)
	}
	x = &execertest.Script{T: t, Missing: map[string]bool{"ip": true}}
	if _, err := NewExec("", WithCommandPrefix("ip", "netns", "exec", "x"), withExecer(x)); !errors.Is(err, exec.ErrNotFound) {
		t.Errorf("got %v, want exec.ErrNotFound for the prefix", err)
	}
}

func TestExecListings(t *testing.T) {
	ctx := context.Background()
	tables := execertest.Call{Argv: []string{"/usr/sbin/nft", "list", "tables", "ip"}, Stdout: "table ip filter\ntable ip kube-proxy\n"}
	chainsJSON := `{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
		{"chain": {"family": "ip", "table": "kube-proxy", "name": "services", "handle": 1}},
		{"chain": {"family": "ip", "table": "filter", "name": "INPUT", "handle": 1}},
		{"chain": {"family": "ip", "table": "kube-proxy", "name": "nat-prerouting", "handle": 2, "type": "nat", "hook": "prerouting", "prio": -100, "policy": "accept"}}]}`
	setsJSON := `{"nftables": [{"metainfo": {}}, {"set": {"family": "ip", "name": "cluster-ips", "table": "kube-proxy", "type": "ipv4_addr", "handle": 3}}]}`
	mapsJSON := `{"nftables": [{"metainfo": {}}, {"map": {"family": "ip", "name": "service-ips", "table": "kube-proxy", "type": ["ipv4_addr", "inet_proto", "inet_service"], "map": "verdict", "handle": 4}}]}`

	x := &execertest.Script{T: t, Calls: []execertest.Call{
		tables,
		tables, {Argv: []string{"/usr/sbin/nft", "--json", "list", "chains", "ip"}, Stdout: chainsJSON},
		tables, {Argv: []string{"/usr/sbin/nft", "--json", "list", "sets", "ip"}, Stdout: setsJSON},
		{Argv: []string{"/usr/sbin/nft", "--json", "list", "maps", "ip"}, Stdout: mapsJSON},
		tables,
		{Argv: []string{"/usr/sbin/nft", "-f", "-"}, Stdin: "delete table ip kube-proxy\n",
			Stderr: "/dev/stdin:1:1-25: Error: Could not process rule: No such file or directory\n"},
	}}
	e, err := NewExec("", withExecer(x))
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := e.TableExists(ctx, IPv4, "kube-proxy"); err != nil || !ok {
		t.Errorf("TableExists = %v, %v; want true", ok, err)
	}
	chains, err := e.ListChains(ctx, IPv4, "kube-proxy")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"nat-prerouting", "services"}, chains); d != "" {
		t.Errorf("ListChains (-want +got):\n%s", d)
	}
	sets, err := e.ListSets(ctx, IPv4, "kube-proxy")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"cluster-ips", "service-ips"}, sets); d != "" {
		t.Errorf("ListSets (-want +got):\n%s", d)
	}
	if _, err := e.ListChains(ctx, IPv4, "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("ListChains of a missing table: %v, want ErrNotFound", err)
	}
	if err := e.DeleteTable(ctx, IPv4, "kube-proxy"); err != nil {
		t.Errorf("DeleteTable of a missing table: %v, want nil", err)
	}
	x.Done()
}

func TestExecRefusesCommentsNftCannotRead(t *testing.T) {
	x := &execertest.Script{T: t}
	e, err := NewExec("", withExecer(x))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{`a "quoted" word`, `back\slash`, "new\nline", strings.Repeat("x", MaxCommentLen+1)} {
		tx := NewTransaction(IPv4, "t")
		tx.Add(&Table{})
		tx.Add(&Chain{Name: "c", Comment: c})
		err := e.Apply(context.Background(), tx)
		var oe *OpError
		if !errors.Is(err, unix.EINVAL) || !errors.As(err, &oe) || oe.Index != 1 {
			t.Errorf("comment %q: got %v, want EINVAL at operation 1", c, err)
		}
	}
	for _, c := range []string{"ns1/svc:http", "héllo", strings.Repeat("x", MaxCommentLen)} {
		if err := CheckComment(c); err != nil {
			t.Errorf("CheckComment(%q) = %v, want nil", c, err)
		}
	}
	x.Done()
}
