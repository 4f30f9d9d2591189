package compat

import (
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

// flagInfo is what --help says about one flag.
type flagInfo struct {
	typ, def   string
	deprecated bool
}

func (f flagInfo) String() string {
	s := "type=" + f.typ + " default=" + f.def
	if f.typ == "" {
		s = "type=bool default=" + f.def
	}
	if f.deprecated {
		s += " deprecated"
	}
	return s
}

// helpLine is a flag line of pflag's usage: "  -v, --v Level    usage".
var (
	helpLine    = regexp.MustCompile(`^\s+(?:-\w, )?--([a-z0-9][a-z0-9_-]*)(?: (\S+))?\s{2,}(.*)$`)
	helpDefault = regexp.MustCompile(`\(default (.*)\)$`)
)

// parseHelp reads the flags of a --help text; continuation lines (the
// feature gate list) are not flags.
func parseHelp(help string) map[string]flagInfo {
	flags := map[string]flagInfo{}
	for _, line := range strings.Split(help, "\n") {
		m := helpLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		info := flagInfo{typ: m[2], deprecated: strings.Contains(m[3], "DEPRECATED")}
		if d := helpDefault.FindStringSubmatch(m[3]); d != nil {
			info.def = d[1]
		}
		flags[m[1]] = info
	}
	return flags
}

func testFlags(t *testing.T) {
	up, _, err := output(time.Minute, upstreamBin, "--help")
	if err != nil {
		t.Fatalf("kube-proxy --help: %v\n%s", err, up)
	}
	kp, _, err := output(time.Minute, kproxyBin, "--help")
	if err != nil {
		t.Fatalf("kproxy --help: %v\n%s", err, kp)
	}
	upFlags, kpFlags := parseHelp(up), parseHelp(kp)
	if len(upFlags) < 50 {
		t.Fatalf("parsed only %d flags from kube-proxy --help; parser broken?\n%s", len(upFlags), up)
	}
	names := map[string]bool{}
	for n := range upFlags {
		names[n] = true
	}
	for n := range kpFlags {
		names[n] = true
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	for _, n := range sorted {
		t.Run(n, func(t *testing.T) {
			u, inUp := upFlags[n]
			k, inKp := kpFlags[n]
			us, ks := u.String(), k.String()
			if !inUp {
				us = "absent"
			}
			if !inKp {
				ks = "absent"
			}
			// kproxy's help names the same thing differently in a few
			// places only where intended says so.
			compare(t, kindFlag, "--"+n, "--"+n, us, ks)
		})
	}
	sectionDone(kindFlag)
}
