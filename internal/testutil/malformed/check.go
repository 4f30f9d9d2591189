package malformed

// What the kernel test (file source) and the end-to-end test (API server)
// both look for in kproxy's log and rules.

import (
	"regexp"
	"strconv"
	"strings"
)

// KlogKV is how klog's text format writes a string value.
func KlogKV(key, v string) string {
	if !strings.Contains(v, "\n") {
		return key + "=" + strconv.Quote(v)
	}
	return key + "=<\n\t" + strings.ReplaceAll(v, "\n", "\n\t") + "\n >"
}

var entryStart = regexp.MustCompile(`(?m)^[IWEF]\d{4} `)

// LogEntries splits a klog text log into entries (a multi-line value
// stays in its entry).
func LogEntries(log string) []string {
	idx := entryStart.FindAllStringIndex(log, -1)
	out := make([]string, 0, len(idx))
	for i, m := range idx {
		end := len(log)
		if i+1 < len(idx) {
			end = idx[i+1][0]
		}
		out = append(out, log[m[0]:end])
	}
	return out
}

// AnyEntry reports whether one entry holds every part.
func AnyEntry(entries []string, parts ...string) bool {
	for _, e := range entries {
		ok := true
		for _, p := range parts {
			if !strings.Contains(e, p) {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// HasAddr reports whether a rules dump (nft list ruleset, iptables-save)
// mentions the address (not as a prefix of a longer one).
func HasAddr(dump, addr string) bool {
	return regexp.MustCompile(`(^|[^0-9.])` + regexp.QuoteMeta(addr) + `([^0-9]|$)`).MatchString(dump)
}

// SkipLog is what the one log entry about a skipped or contested case
// holds, whatever the source; nil for a case that is not reported
// (accepted, not proxied, ignored) and for undecodable items, which
// only the file source reports (with the file and the item).
func SkipLog(c Case) []string {
	switch {
	case c.Reason == ReasonUndecodable:
		return nil
	case c.Want == Contested:
		return []string{`"Service port loses a contested address`, KlogKV("servicePort", c.Object+":http/TCP")}
	case c.Want == Skip || c.Want == SkipPart:
		return []string{`"Skipping invalid `, KlogKV("kind", c.Kind), KlogKV("object", c.Object), KlogKV("category", c.Reason)}
	}
	return nil
}

// Reported reports whether a case is logged and counted as invalid (or
// contested).
func Reported(c Case) bool {
	return c.Want == Skip || c.Want == SkipPart || c.Want == Contested
}

// ThroughAPI is the case as kproxy meets it through the API server: Want
// is APIWant where that is set (with no reason when it is not reported).
func (c Case) ThroughAPI() Case {
	if c.APIWant == "" {
		return c
	}
	c.Want = c.APIWant
	if !Reported(c) {
		c.Reason = ""
	}
	return c
}
