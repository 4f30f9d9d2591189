package nft

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

// scriptedExecer checks each command against the script and plays back
// its output.
type scriptedExecer struct {
	t       *testing.T
	missing map[string]bool // binaries LookPath does not find
	script  []scriptedCall
}

type scriptedCall struct {
	argv   []string
	stdin  string
	stdout string
	stderr string // non-empty: the command fails with this stderr
}

func (s *scriptedExecer) LookPath(file string) (string, error) {
	if s.missing[file] {
		return "", &exec.Error{Name: file, Err: exec.ErrNotFound}
	}
	if strings.Contains(file, "/") {
		return file, nil
	}
	return "/usr/sbin/" + file, nil
}

func (s *scriptedExecer) Run(ctx context.Context, argv []string, stdin string) (string, error) {
	s.t.Helper()
	if len(s.script) == 0 {
		s.t.Fatalf("unexpected command %q", argv)
	}
	c := s.script[0]
	s.script = s.script[1:]
	if d := cmp.Diff(c.argv, argv); d != "" {
		s.t.Errorf("argv (-want +got):\n%s", d)
	}
	if d := cmp.Diff(c.stdin, stdin); d != "" {
		s.t.Errorf("stdin (-want +got):\n%s", d)
	}
	if c.stderr != "" {
		return c.stdout, &runError{Argv: argv, Stderr: c.stderr, Err: errors.New("exit status 1")}
	}
	return c.stdout, nil
}

func (s *scriptedExecer) done() {
	s.t.Helper()
	if len(s.script) > 0 {
		s.t.Errorf("%d scripted commands were not run, first %q", len(s.script), s.script[0].argv)
	}
}

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
			x := &scriptedExecer{t: t, script: []scriptedCall{{argv: nftArgv, stdin: tx.String(), stderr: c.stderr}}}
			e, err := NewExec("", WithCommandPrefix("ip", "netns", "exec", "ns1"), withExecer(x))
			if err != nil {
				t.Fatal(err)
			}
			c.check(t, e.Apply(context.Background(), tx))
			x.done()
		})
	}
}

func TestExecEmptyTransactionRunsNothing(t *testing.T) {
	x := &scriptedExecer{t: t}
	e, err := NewExec("/sbin/nft", withExecer(x))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Apply(context.Background(), NewTransaction(IPv4, "t")); err != nil {
		t.Fatal(err)
	}
	x.done()
}

func TestExecMissingBinary(t *testing.T) {
	x := &scriptedExecer{t: t, missing: map[string]bool{"nft": true}}
	_, err := NewExec("", withExecer(x))
	if !errors.Is(err, ErrNotSupported) || !errors.Is(err, exec.ErrNotFound) || !strings.Contains(err.Error(), `"nft"`) {
		t.Errorf("got %v, want ErrNotSupported and exec.ErrNotFound naming nft", err)
	}
	x = &scriptedExecer{t: t, missing: map[string]bool{"ip": true}}
	if _, err := NewExec("", WithCommandPrefix("ip", "netns", "exec", "x"), withExecer(x)); !errors.Is(err, exec.ErrNotFound) {
		t.Errorf("got %v, want exec.ErrNotFound for the prefix", err)
	}
}

func TestExecListings(t *testing.T) {
	ctx := context.Background()
	tables := scriptedCall{argv: []string{"/usr/sbin/nft", "list", "tables", "ip"}, stdout: "table ip filter\ntable ip kube-proxy\n"}
	chainsJSON := `{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
		{"chain": {"family": "ip", "table": "kube-proxy", "name": "services", "handle": 1}},
		{"chain": {"family": "ip", "table": "filter", "name": "INPUT", "handle": 1}},
		{"chain": {"family": "ip", "table": "kube-proxy", "name": "nat-prerouting", "handle": 2, "type": "nat", "hook": "prerouting", "prio": -100, "policy": "accept"}}]}`
	setsJSON := `{"nftables": [{"metainfo": {}}, {"set": {"family": "ip", "name": "cluster-ips", "table": "kube-proxy", "type": "ipv4_addr", "handle": 3}}]}`
	mapsJSON := `{"nftables": [{"metainfo": {}}, {"map": {"family": "ip", "name": "service-ips", "table": "kube-proxy", "type": ["ipv4_addr", "inet_proto", "inet_service"], "map": "verdict", "handle": 4}}]}`

	x := &scriptedExecer{t: t, script: []scriptedCall{
		tables,
		tables, {argv: []string{"/usr/sbin/nft", "--json", "list", "chains", "ip"}, stdout: chainsJSON},
		tables, {argv: []string{"/usr/sbin/nft", "--json", "list", "sets", "ip"}, stdout: setsJSON},
		{argv: []string{"/usr/sbin/nft", "--json", "list", "maps", "ip"}, stdout: mapsJSON},
		tables,
		{argv: []string{"/usr/sbin/nft", "-f", "-"}, stdin: "delete table ip kube-proxy\n",
			stderr: "/dev/stdin:1:1-25: Error: Could not process rule: No such file or directory\n"},
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
	x.done()
}

func TestExecRefusesCommentsNftCannotRead(t *testing.T) {
	x := &scriptedExecer{t: t}
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
	x.done()
}
