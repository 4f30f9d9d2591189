package xtables

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	kexec "github.com/kproxy/kproxy/internal/kernel/execer"
)

// Interface runs one backend's restore/save binaries for one IP family.
// New gives the real one; xtablestest.Fake keeps the rules in memory.
type Interface interface {
	Backend() Backend
	Family() Family
	// Restore feeds data (iptables-save syntax, several tables allowed) to
	// <iptables|ip6tables>-<backend>-restore. NoFlush adds --noflush. The
	// xtables lock wait is bounded (-w seconds, legacy) and a lock timeout
	// is an error wrapping ErrLockTimeout. Each table is all-or-nothing;
	// tables before the failing one stay applied (iptables-restore commits
	// at every COMMIT line, with both backends). A failure is a
	// *RestoreError.
	Restore(ctx context.Context, data []byte, opts RestoreOptions) error
	// RestoreWithStats is Restore, also saying how long the run took and
	// how long it waited for the xtables lock, for the proxier's metrics.
	RestoreWithStats(ctx context.Context, data []byte, opts RestoreOptions) (RestoreStats, error)
	// Save returns one table in iptables-save syntax. With the legacy
	// backend, naming a table that does not exist creates it (the kernel
	// loads it on first access); the nft backend prints the empty built-in
	// chains without creating anything.
	Save(ctx context.Context, table string) ([]byte, error)
	// Version runs `<iptables|ip6tables>-<backend> --version` and returns
	// the version ("1.8.9"). Versions below MinVersion are an error
	// matching ErrUnsupportedVersion, and so is a binary of the other
	// backend behind this backend's name.
	Version(ctx context.Context) (string, error)
}

// RestoreOptions change how Restore runs.
type RestoreOptions struct {
	// NoFlush keeps what the input does not name: tables not in the input
	// stay as they are, and so do chains of a named table that are not
	// declared (":CHAIN") in it. Without it every table in the input is
	// replaced as a whole.
	NoFlush bool
	// Test only parses and checks the input (iptables-restore --test):
	// nothing is committed, whichever table fails. iptables-restore
	// commits table by table, so an input whose later table fails leaves
	// the earlier ones applied; a test run first keeps an input that will
	// fail from changing anything.
	Test bool
}

// RestoreStats describes one restore run.
type RestoreStats struct {
	// Duration is the whole run, lock wait included.
	Duration time.Duration
	// LockWait is how long another holder of the xtables lock (the
	// kubelet, a CNI, firewalld...) kept kproxy waiting before the run.
	// iptables 1.8 prints nothing while it waits, so kproxy waits for the
	// lock itself first and lets it go just before starting the restore;
	// someone grabbing it in between is not counted. Legacy only: the nft
	// backend takes no lock.
	LockWait time.Duration
}

// MinVersion is the oldest iptables kproxy accepts: 1.8.0–1.8.3 have
// compatibility bugs between their nft backend and the legacy one (the
// kube-proxy image's iptables-wrapper refuses them too).
const MinVersion = "1.8.4"

var (
	// ErrLockTimeout means the legacy backend could not take the xtables
	// lock (/run/xtables.lock) within the wait bound: another program held
	// it. Nothing was changed; retry later.
	ErrLockTimeout = errors.New("timed out waiting for the xtables lock")
	// ErrUnsupportedVersion means the iptables binaries are too old (or
	// not the backend their name says).
	ErrUnsupportedVersion = errors.New("unsupported iptables version")
)

// RestoreError is a failed restore run.
type RestoreError struct {
	Backend Backend
	Family  Family
	// Line is the 1-based line of the restore input that was rejected, 0
	// when unknown.
	Line int
	// Detail is what iptables-restore said, on one line.
	Detail string
	// Err is the cause: an *execer.RunError, wrapped with ErrLockTimeout
	// when the xtables lock could not be taken.
	Err error
}

func (e *RestoreError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "xtables: %s %s restore failed", e.Backend, e.Family)
	if e.Line > 0 {
		fmt.Fprintf(&b, " at line %d", e.Line)
	}
	switch {
	case e.Detail != "":
		b.WriteString(": " + e.Detail)
		if errors.Is(e.Err, ErrLockTimeout) {
			b.WriteString(" (" + ErrLockTimeout.Error() + ")")
		}
	case e.Err != nil:
		b.WriteString(": " + e.Err.Error())
	}
	return b.String()
}

func (e *RestoreError) Unwrap() error { return e.Err }

// Tables lists the xtables tables, in the order iptables names them. A
// table name outside this list is an error for Save and Restore.
var Tables = []string{"filter", "nat", "mangle", "raw", "security"}

// BuiltinChains are the built-in chains of each table, in hook order: the
// order iptables-save prints them.
var BuiltinChains = map[string][]string{
	"filter":   {"INPUT", "FORWARD", "OUTPUT"},
	"nat":      {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	"mangle":   {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"},
	"raw":      {"PREROUTING", "OUTPUT"},
	"security": {"INPUT", "FORWARD", "OUTPUT"},
}

// DefaultLockWait bounds the wait for the xtables lock, as upstream
// kube-proxy's restore does (-w 5).
const DefaultLockWait = 5 * time.Second

// runner is the real Interface.
type runner struct {
	*tool
	cmd string // iptables-legacy, ip6tables-nft...
}

var _ Interface = (*runner)(nil)

// New returns the Interface of one backend and family. It only resolves the
// binaries (<iptables|ip6tables>-<backend>, -save and -restore, by their
// explicit names so that /etc/alternatives does not matter) and runs
// nothing; a missing one is an error matching ErrNotInstalled that names
// it.
func New(b Backend, f Family, opts ...Option) (Interface, error) {
	t, err := newTool(b, f, newOptions(opts), true)
	if err != nil {
		return nil, err
	}
	return &runner{tool: t, cmd: t.cmd}, nil
}

func (r *runner) Backend() Backend { return r.backend }
func (r *runner) Family() Family   { return r.family }

func (r *runner) Restore(ctx context.Context, data []byte, opts RestoreOptions) error {
	_, err := r.RestoreWithStats(ctx, data, opts)
	return err
}

func (r *runner) RestoreWithStats(ctx context.Context, data []byte, opts RestoreOptions) (RestoreStats, error) {
	var args []string
	if opts.NoFlush {
		args = append(args, "--noflush")
	}
	if opts.Test {
		args = append(args, "--test")
	}
	if r.backend == Legacy {
		// iptables rounds nothing: -w takes whole seconds.
		secs := int((r.o.lockWait + time.Second - 1) / time.Second)
		args = append(args, "-w", strconv.Itoa(secs))
	}
	start := r.o.now()
	var st RestoreStats
	if r.backend == Legacy {
		waited, err := r.o.lockProbe(ctx, r.o.lockWait)
		st.LockWait = waited
		if err != nil {
			st.Duration = r.o.now().Sub(start)
			return st, &RestoreError{Backend: r.backend, Family: r.family, Err: err}
		}
	}
	_, err := kexec.RunBytes(ctx, r.o.exec, r.argv(r.restore, args...), data)
	st.Duration = r.o.now().Sub(start)
	if err != nil {
		return st, restoreError(r.backend, r.family, err)
	}
	return st, nil
}

// lockHeld is what iptables prints when -w ran out: "Another app is
// currently holding the xtables lock. Stopped waiting after 5s." (exit
// status 4).
const lockHeld = "Another app is currently holding the xtables lock"

// restoreLine finds the failing input line in iptables-restore's
// messages: "iptables-restore: line 5 failed", "Error occurred at line: 3",
// "COMMIT expected at line 3", or nft's "line 2: CHAIN_DEL failed ...".
var restoreLine = regexp.MustCompile(`(?:line (\d+) failed|Error occurred at line: (\d+)|COMMIT expected at line (\d+)|line (\d+): )`)

func restoreError(b Backend, f Family, err error) error {
	e := &RestoreError{Backend: b, Family: f, Err: err}
	var re *runError
	if !errors.As(err, &re) {
		return e
	}
	e.Detail = oneLine(re.Stderr)
	if m := restoreLine.FindStringSubmatch(re.Stderr); m != nil {
		for _, s := range m[1:] {
			if s != "" {
				e.Line, _ = strconv.Atoi(s)
				break
			}
		}
	}
	if strings.Contains(re.Stderr, lockHeld) {
		e.Err = fmt.Errorf("%w: %w", ErrLockTimeout, err)
	}
	return e
}

// HostFault says whether the restore failed for the host's reasons (the
// xtables lock held by another program past the wait) rather than its
// input's: the proxy's failure isolation then refuses no service.
func (e *RestoreError) HostFault() bool { return errors.Is(e.Err, ErrLockTimeout) }

// oneLine joins the non-empty lines of a message, dropping iptables'
// usage hint.
func oneLine(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "Try `") {
			continue
		}
		switch {
		case b.Len() == 0:
		case strings.HasSuffix(b.String(), ":"):
			// "iptables-nft-restore v1.8.9 (nf_tables): " then the message
			b.WriteByte(' ')
		default:
			b.WriteString("; ")
		}
		b.WriteString(l)
	}
	return b.String()
}

func (r *runner) Save(ctx context.Context, table string) ([]byte, error) {
	if !slices.Contains(Tables, table) {
		return nil, fmt.Errorf("xtables: unknown table %q (want one of %s)", table, strings.Join(Tables, ", "))
	}
	out, err := kexec.RunBytes(ctx, r.o.exec, r.argv(r.save, "-t", table), nil)
	if err != nil {
		return nil, fmt.Errorf("xtables: saving %s %s table %s: %w", r.backend, r.family, table, err)
	}
	return out, nil
}

func (r *runner) Version(ctx context.Context) (string, error) {
	out, err := r.o.exec.Run(ctx, r.argv(r.cmd, "--version"), "")
	if err != nil {
		return "", fmt.Errorf("xtables: %s --version: %w", r.cmd, err)
	}
	return checkVersion(r.backend, out)
}

// versionLine is what `iptables --version` prints: "iptables v1.8.9
// (legacy)", "ip6tables v1.8.9 (nf_tables)"; before 1.8 without the
// backend.
var versionLine = regexp.MustCompile(`^ip6?tables v(\d+)\.(\d+)\.(\d+)(?: \(([a-z_]+)\))?`)

// checkVersion parses --version output and checks it against MinVersion
// and the backend.
func checkVersion(b Backend, out string) (string, error) {
	out = strings.TrimSpace(out)
	m := versionLine.FindStringSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("xtables: cannot read the iptables version from %q", out)
	}
	v := [3]int{}
	for i := range v {
		v[i], _ = strconv.Atoi(m[i+1])
	}
	version := fmt.Sprintf("%d.%d.%d", v[0], v[1], v[2])
	if slices.Compare(v[:], []int{1, 8, 4}) < 0 {
		return version, fmt.Errorf("xtables: %w: iptables %s (%s backend); kproxy needs %s or newer (1.8.0 to 1.8.3 have compatibility bugs)", ErrUnsupportedVersion, version, b, MinVersion)
	}
	want := map[Backend]string{Legacy: "legacy", NFT: "nf_tables"}[b]
	if m[4] != want {
		return version, fmt.Errorf("xtables: %w: iptables-%s reports backend %q, want %q", ErrUnsupportedVersion, b, m[4], want)
	}
	return version, nil
}
