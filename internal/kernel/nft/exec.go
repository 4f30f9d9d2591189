package nft

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	kexec "github.com/kproxy/kproxy/internal/kernel/execer"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// Exec applies transactions by running `nft -f -` with the transaction
// text on stdin. nft itself sends the whole file as one batch, so it is
// atomic too. kproxy does not use it at run time (nftables mode always
// talks netlink, Netlink); it is the oracle the netlink encoder is tested
// against: the kernel tests apply every transaction both ways and compare
// the kernel's listings (kernel_test.go, applyBoth), and nfttest loads
// real kernel dumps through it (nfttest/kernel_test.go). It stays in this
// package, not a _test file, because both packages' tests use it.
type Exec struct {
	nft    string
	prefix []string
	exec   execer
}

var _ Interface = (*Exec)(nil)

// execer runs commands; unit tests replace it to script argv and stdin.
type execer = kexec.Interface

type runError = kexec.RunError

type osExecer = kexec.OS

// ExecOption configures NewExec.
type ExecOption func(*Exec)

// WithCommandPrefix runs nft through another command, for example
// "ip", "netns", "exec", "NAME" to program a network namespace.
func WithCommandPrefix(argv ...string) ExecOption {
	return func(e *Exec) { e.prefix = append([]string(nil), argv...) }
}

func withExecer(x execer) ExecOption { return func(e *Exec) { e.exec = x } }

// NewExec returns an adapter running the nft binary at nftPath ("" means
// "nft" from $PATH). A missing binary is an error matching ErrNotSupported
// and exec.ErrNotFound.
func NewExec(nftPath string, opts ...ExecOption) (*Exec, error) {
	if nftPath == "" {
		nftPath = "nft"
	}
	e := &Exec{exec: osExecer{}}
	for _, o := range opts {
		o(e)
	}
	p, err := e.exec.LookPath(nftPath)
	if err != nil {
		return nil, fmt.Errorf("nft: %w: the nft binary %q was not found (install the nftables package): %w", ErrNotSupported, nftPath, err)
	}
	e.nft = p
	if len(e.prefix) > 0 {
		if _, err := e.exec.LookPath(e.prefix[0]); err != nil {
			return nil, fmt.Errorf("nft: command prefix %q not found: %w", e.prefix[0], err)
		}
	}
	return e, nil
}

func (e *Exec) argv(args ...string) []string {
	return append(append(slices.Clone(e.prefix), e.nft), args...)
}

// Apply runs `nft -f -` with the transaction text.
func (e *Exec) Apply(ctx context.Context, tx *Transaction) error {
	if tx.Len() == 0 {
		return nil
	}
	if err := checkComments(tx); err != nil {
		return WrapApplyError(tx, err)
	}
	text := tx.String()
	if _, err := e.exec.Run(ctx, e.argv("-f", "-"), text); err != nil {
		return WrapApplyError(tx, explainExec(tx, err))
	}
	klog.V(4).InfoS("Applied nftables transaction with nft", "family", tx.Family, "tables", tx.Tables(), "operations", tx.Len())
	return nil
}

// checkComments refuses comments nft would misread (see CheckComment)
// with the same error the netlink adapter gives.
func checkComments(tx *Transaction) error {
	for i := range tx.Ops {
		if err := CheckComment(tx.Ops[i].Comment()); err != nil {
			return &OpError{Index: i, Op: tx.OpText(i), Err: err}
		}
	}
	return nil
}

// nft reports errors as "/dev/stdin:LINE:COL-COL: Error: MESSAGE".
var nftErrLine = regexp.MustCompile(`(?m)^(?:/dev/stdin|-):(\d+):[0-9-]+: Error: (.*)$`)

// errnos nft may print (as strerror text) for kernel rejections. Knowing
// the errno lets callers use errors.Is the same way for both adapters.
var knownErrnos = []unix.Errno{
	unix.ENOENT, unix.EEXIST, unix.EBUSY, unix.EOPNOTSUPP, unix.EINVAL, unix.ENOSPC,
	unix.EPERM, unix.ELOOP, unix.E2BIG, unix.EMSGSIZE, unix.ENOMEM, unix.ENOBUFS,
	unix.EPROTONOSUPPORT, unix.EAFNOSUPPORT, unix.ERANGE, unix.EOVERFLOW,
}

func errnoIn(msg string) (unix.Errno, bool) {
	lower := strings.ToLower(msg)
	for _, en := range knownErrnos {
		if strings.Contains(lower, strings.ToLower(en.Error())) {
			return en, true
		}
	}
	return 0, false
}

// explainExec maps nft's stderr to OpErrors: the line number is the
// operation (one per line), the strerror text the errno.
func explainExec(tx *Transaction, err error) error {
	var re *runError
	if !errors.As(err, &re) {
		return err
	}
	stderr := re.Stderr
	if strings.Contains(stderr, "cache initialization failed") || strings.Contains(strings.ToLower(stderr), "protocol not supported") {
		return fmt.Errorf("%w in this kernel: %w", ErrNotSupported, re)
	}
	var out []error
	for _, m := range nftErrLine.FindAllStringSubmatch(stderr, -1) {
		line, _ := strconv.Atoi(m[1])
		oe := &OpError{Index: -1, Message: m[2]}
		if line >= 1 && line <= tx.Len() {
			oe.Index = line - 1
			oe.Op = tx.OpText(line - 1)
		}
		if en, ok := errnoIn(m[2]); ok {
			oe.Err = en
		} else {
			oe.Err = errors.New("rejected by nft")
		}
		out = append(out, oe)
	}
	if len(out) == 0 {
		return re
	}
	if len(out) == 1 {
		return out[0]
	}
	return errors.Join(out...)
}

// TableExists runs `nft list tables FAMILY`.
func (e *Exec) TableExists(ctx context.Context, family Family, table string) (bool, error) {
	out, err := e.exec.Run(ctx, e.argv("list", "tables", string(family)), "")
	if err != nil {
		return false, fmt.Errorf("nft: listing tables: %w", err)
	}
	want := fmt.Sprintf("table %s %s", family, table)
	for _, l := range strings.Split(out, "\n") {
		if strings.TrimSpace(l) == want {
			return true, nil
		}
	}
	return false, nil
}

// ListTables runs `nft list tables FAMILY`.
func (e *Exec) ListTables(ctx context.Context, family Family) ([]string, error) {
	out, err := e.exec.Run(ctx, e.argv("list", "tables", string(family)), "")
	if err != nil {
		return nil, fmt.Errorf("nft: listing tables: %w", err)
	}
	var names []string
	prefix := fmt.Sprintf("table %s ", family)
	for _, l := range strings.Split(out, "\n") {
		if name, ok := strings.CutPrefix(strings.TrimSpace(l), prefix); ok && name != "" {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// ListChains runs `nft --json list chains FAMILY` and keeps the table's.
func (e *Exec) ListChains(ctx context.Context, family Family, table string) ([]string, error) {
	return e.listJSON(ctx, family, table, []string{"chains"}, "chain")
}

// ListSets lists the table's named sets and maps.
func (e *Exec) ListSets(ctx context.Context, family Family, table string) ([]string, error) {
	return e.listJSON(ctx, family, table, []string{"sets", "maps"}, "set", "map")
}

func (e *Exec) listJSON(ctx context.Context, family Family, table string, what []string, kinds ...string) ([]string, error) {
	ok, err := e.TableExists(ctx, family, table)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("nft: table %s %s: %w", family, table, ErrNotFound)
	}
	var names []string
	for _, w := range what {
		out, err := e.exec.Run(ctx, e.argv("--json", "list", w, string(family)), "")
		if err != nil {
			return nil, fmt.Errorf("nft: listing %s: %w", w, err)
		}
		var doc struct {
			Nftables []map[string]json.RawMessage `json:"nftables"`
		}
		if err := json.Unmarshal([]byte(out), &doc); err != nil {
			return nil, fmt.Errorf("nft: parsing the JSON listing of %s: %w", w, err)
		}
		for _, obj := range doc.Nftables {
			for _, k := range kinds {
				raw, ok := obj[k]
				if !ok {
					continue
				}
				var o struct{ Family, Table, Name string }
				if err := json.Unmarshal(raw, &o); err != nil {
					return nil, fmt.Errorf("nft: parsing the JSON listing of %s: %w", w, err)
				}
				if o.Family == string(family) && o.Table == table {
					names = append(names, o.Name)
				}
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// DeleteTable runs `nft delete table`; a missing table is not an error.
func (e *Exec) DeleteTable(ctx context.Context, family Family, table string) error {
	tx := NewTransaction(family, table)
	tx.Delete(&Table{})
	err := e.Apply(ctx, tx)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}
