// Command testsummary reads the `go test -json` event streams hack/test.sh
// keeps (one file per group of packages) and prints one closing line:
//
//	N passed, N failed, N skipped
//
// counting every test and subtest, with a package that failed without a
// failing test (a build failure, a panic in TestMain, a timeout) counted
// as one failed test. It lists the failed tests above that line, and exits
// 1 when anything failed.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
)

// event is the part of test2json's output this needs.
type event struct {
	Action  string
	Package string
	Test    string
}

type counts struct {
	passed, failed, skipped int
	failures                []string
}

func (c *counts) read(r io.Reader) error {
	// Packages with a failing test, to tell a package-level failure apart.
	testFailed := map[string]bool{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue // go vet or build output mixed in
		}
		switch {
		case e.Test != "" && e.Action == "pass":
			c.passed++
		case e.Test != "" && e.Action == "skip":
			c.skipped++
		case e.Test != "" && e.Action == "fail":
			c.failed++
			testFailed[e.Package] = true
			c.failures = append(c.failures, e.Package+" "+e.Test)
		case e.Test == "" && e.Action == "fail" && !testFailed[e.Package]:
			c.failed++
			c.failures = append(c.failures, e.Package+" (package failed: build error, panic or timeout)")
		}
	}
	return sc.Err()
}

func main() {
	var c counts
	for _, path := range os.Args[1:] {
		f, err := os.Open(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "testsummary:", err)
			os.Exit(2)
		}
		err = c.read(f)
		f.Close()
		if err != nil {
			fmt.Fprintf(os.Stderr, "testsummary: %s: %v\n", path, err)
			os.Exit(2)
		}
	}
	sort.Strings(c.failures)
	for _, f := range c.failures {
		fmt.Println("FAILED:", f)
	}
	fmt.Printf("%d passed, %d failed, %d skipped\n", c.passed, c.failed, c.skipped)
	if c.failed > 0 {
		os.Exit(1)
	}
}
