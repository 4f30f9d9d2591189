package nftstate

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

// run applies text in one transaction of dialect d and commits it.
func run(st *State, d Dialect, text string) error {
	x := st.Begin(d, 1)
	if err := nft.Read(text, x.SetDef, x.Apply); err != nil {
		return err
	}
	return x.Commit()
}

// TestDialects pins what differs between the two dialects: how a refusal
// is reported, when what a rule names is checked, and "delete rule" by
// its statements; and that a refused transaction changes nothing.
func TestDialects(t *testing.T) {
	const head = "add table ip t { comment \"c\" ; }\nadd chain ip t c\n"

	// A jump to a chain added later in the same text: nft -f reads the
	// whole file first; the kernel checks each message as it comes.
	forward := head + "add rule ip t c jump later\nadd chain ip t later\n"
	if err := run(&State{}, File, forward); err != nil {
		t.Errorf("File: a jump to a chain added further down: %v", err)
	}
	err := run(&State{}, Netlink, forward)
	var oe *nft.OpError
	if !errors.As(err, &oe) || oe.Index != 2 || !errors.Is(err, unix.ENOENT) {
		t.Errorf("Netlink: got %v, want ENOENT naming operation index 2", err)
	}

	// The same refusal, found at commit: a line in File, an index in
	// Netlink, the errno in both.
	missing := head + "add rule ip t c jump nope\n"
	err = run(&State{}, File, missing)
	var pe *nft.ParseError
	if !errors.As(err, &pe) || pe.Line != 3 || !errors.Is(err, unix.ENOENT) {
		t.Errorf("File: got %v, want ENOENT on line 3", err)
	}

	// "delete rule" naming the rule by its statements is text's alone.
	del := "delete rule ip t c accept\n"
	st := &State{}
	if err := run(st, File, head+"add rule ip t c accept\n"); err != nil {
		t.Fatal(err)
	}
	if err := run(st, Netlink, del); !errors.Is(err, unix.EINVAL) {
		t.Errorf("Netlink: delete rule without a handle: got %v, want EINVAL", err)
	}
	if err := run(st, File, del); err != nil {
		t.Errorf("File: delete rule by its statements: %v", err)
	}
	if n := len(st.Table(nft.IPv4, "t").Chains["c"].Rules); n != 0 {
		t.Errorf("%d rules left after the deletion", n)
	}

	// A refused transaction leaves the state as it was, in both.
	for _, d := range []Dialect{Netlink, File} {
		if err := run(st, d, "add chain ip t new\ndelete chain ip t missing\n"); err == nil {
			t.Fatalf("dialect %d: deleting a missing chain succeeded", d)
		}
		if st.Table(nft.IPv4, "t").Chains["new"] != nil {
			t.Errorf("dialect %d: a refused transaction left a chain behind", d)
		}
	}
}
