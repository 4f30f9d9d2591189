package nft

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// Interface is what the rest of kproxy knows about nftables. Netlink talks
// to the kernel (Exec too, through the nft binary: the tests' oracle);
// nfttest.Fake keeps state in memory.
type Interface interface {
	// Apply runs every operation of tx as one nf_tables transaction:
	// either all of them take effect or none does. An error says which
	// operation the kernel rejected when that is known (see *OpError).
	Apply(ctx context.Context, tx *Transaction) error
	// ListTables returns the names of the tables of a family, sorted.
	ListTables(ctx context.Context, family Family) ([]string, error)
	// ListChains returns the names of the chains of a table. A missing
	// table is an error matching ErrNotFound.
	ListChains(ctx context.Context, family Family, table string) ([]string, error)
	// ListSets returns the names of the named sets and maps of a table.
	// A missing table is an error matching ErrNotFound.
	ListSets(ctx context.Context, family Family, table string) ([]string, error)
	// DeleteTable removes a table and everything in it. Deleting a table
	// that does not exist is not an error (cleanup is idempotent).
	DeleteTable(ctx context.Context, family Family, table string) error
	// TableExists reports whether the table exists.
	TableExists(ctx context.Context, family Family, table string) (bool, error)
}

// Checker is implemented by an Interface that can try a transaction
// without committing it: every operation runs and the result is
// validated as Apply would, then the transaction is aborted. A nil error
// means Apply of the same transaction against the same state would
// succeed (barring a change in between). Failure isolation uses it so that
// its trials never leave a subset of the services in place.
type Checker interface {
	Check(ctx context.Context, tx *Transaction) error
}

var (
	// ErrNotSupported means nf_tables cannot be used here: the kernel
	// lacks it (or netfilter netlink), or the nft binary is missing.
	ErrNotSupported = errors.New("nf_tables is not available")
	// ErrNotFound is returned when listing objects of a missing table.
	ErrNotFound = errors.New("no such table")
)

// OpError is the kernel's (or nft's) rejection of one operation of a
// transaction. Because transactions are atomic, nothing of the
// transaction was applied. Err is usually a syscall.Errno such as
// ENOENT (missing chain, set or element), EEXIST (conflicting
// redefinition or element), EBUSY (object still in use) or EOPNOTSUPP
// (statement not allowed at that hook); test it with errors.Is.
type OpError struct {
	// Index of the operation in Transaction.Ops; -1 when the error is
	// about the transaction as a whole.
	Index int
	// Op is the operation in nft -f syntax.
	Op string
	// Detail narrows down the culprit when known: the element or the
	// statement of a rule.
	Detail string
	// Message is the kernel's extended ack text or nft's message, if any.
	Message string
	Err     error
}

func (e *OpError) Error() string {
	var b strings.Builder
	if e.Index >= 0 {
		fmt.Fprintf(&b, "operation %d %q", e.Index+1, e.Op)
	} else {
		b.WriteString("transaction")
	}
	if e.Detail != "" {
		fmt.Fprintf(&b, " (at %s)", e.Detail)
	}
	b.WriteString(": ")
	// nft's messages already contain the errno text.
	switch {
	case e.Message == "" && e.Err != nil:
		b.WriteString(e.Err.Error())
	case e.Err != nil && !strings.Contains(strings.ToLower(e.Message), strings.ToLower(e.Err.Error())):
		b.WriteString(e.Message + ": " + e.Err.Error())
	default:
		b.WriteString(e.Message)
	}
	return b.String()
}

func (e *OpError) Unwrap() error { return e.Err }

// OpText renders operation i of the transaction as one line of nft -f
// syntax (without the trailing newline).
func (t *Transaction) OpText(i int) string {
	var b strings.Builder
	t.writeOp(&b, &t.Ops[i])
	return b.String()
}

// ErrnoError is an error found before anything reached the kernel, with
// the errno the kernel would have given for it (a comment nft cannot
// read back, a malformed object, a feature nft does not have).
type ErrnoError struct {
	Msg   string
	Errno unix.Errno
}

func (e *ErrnoError) Error() string { return e.Msg }
func (e *ErrnoError) Unwrap() error { return e.Errno }

// WrapApplyError wraps the errors of a failed Apply so that the message
// names the tables and the transaction size.
func WrapApplyError(t *Transaction, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("nft: transaction of %d operations on %s not applied: %w", t.Len(), t.Where(), err)
}

// Where names the tables of the transaction for messages: "table ip
// kube-proxy", or "tables ip kube-proxy, kube-proxy-s0 (+2 more)".
func (t *Transaction) Where() string {
	tables := t.Tables()
	switch {
	case len(tables) == 0:
		return fmt.Sprintf("table %s %s", t.Family, t.Table)
	case len(tables) == 1:
		return fmt.Sprintf("table %s %s", t.Family, tables[0])
	case len(tables) <= 3:
		return fmt.Sprintf("tables %s %s", t.Family, strings.Join(tables, ", "))
	}
	return fmt.Sprintf("tables %s %s (+%d more)", t.Family, strings.Join(tables[:3], ", "), len(tables)-3)
}

// MaxCommentLen is the longest comment nft accepts (bytes).
const MaxCommentLen = 128

// CheckComment reports whether nft can take a comment as the text form
// writes it: at most MaxCommentLen bytes, and nothing the quoting would
// escape (nft reads strings without escape sequences, so a double quote,
// a backslash or a control character would not survive). Both adapters
// and the fake refuse such comments (EINVAL), so that what `kproxy
// render` prints is always what is applied.
func CheckComment(s string) error {
	if len(s) > MaxCommentLen {
		return &ErrnoError{Msg: fmt.Sprintf("comment of %d bytes, nft allows %d", len(s), MaxCommentLen), Errno: unix.EINVAL}
	}
	if !quotesAsIs(s) {
		return &ErrnoError{Msg: fmt.Sprintf("comment %s has characters nft cannot read back", quote(s)), Errno: unix.EINVAL}
	}
	return nil
}

// quotesAsIs reports whether quote(s) is s between double quotes: valid
// UTF-8, printable, no double quote or backslash. Checked rune by rune
// rather than by quoting: every element of a full sync has a comment.
func quotesAsIs(s string) bool {
	for i, r := range s {
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(s[i:]); size == 1 {
				return false
			}
		}
		if r == '"' || r == '\\' || !strconv.IsPrint(r) {
			return false
		}
	}
	return true
}
