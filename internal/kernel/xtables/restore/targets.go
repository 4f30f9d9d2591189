package restore

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
)

const (
	accept = "ACCEPT"
	drop   = "DROP"
)

// verdicts are the standard targets.
var verdicts = []string{accept, drop, "RETURN", "QUEUE"}

// targetInfo restricts where an extension target may be used: the table
// (the kernel module's .table) and the built-in chains it may be reached
// from (.hooks). Empty means anywhere.
type targetInfo struct {
	table string
	hooks []string
}

// targets are the extension targets iptables knows, besides chains and
// the verdicts.
var targets = map[string]*targetInfo{
	"DNAT":        {table: "nat", hooks: []string{"PREROUTING", "OUTPUT"}},
	"REDIRECT":    {table: "nat", hooks: []string{"PREROUTING", "OUTPUT"}},
	"SNAT":        {table: "nat", hooks: []string{"POSTROUTING", "INPUT"}},
	"MASQUERADE":  {table: "nat", hooks: []string{"POSTROUTING"}},
	"NETMAP":      {table: "nat"},
	"REJECT":      {table: "filter", hooks: []string{"INPUT", "FORWARD", "OUTPUT"}},
	"CT":          {table: "raw"},
	"NOTRACK":     {table: "raw"},
	"TRACE":       {table: "raw"},
	"TPROXY":      {table: "mangle"},
	"DSCP":        {table: "mangle"},
	"TOS":         {table: "mangle"},
	"TTL":         {table: "mangle"},
	"HL":          {table: "mangle"},
	"CHECKSUM":    {table: "mangle"},
	"MARK":        {},
	"CONNMARK":    {},
	"LOG":         {},
	"NFLOG":       {},
	"ULOG":        {},
	"NFQUEUE":     {},
	"TCPMSS":      {},
	"CLASSIFY":    {},
	"CLUSTERIP":   {},
	"SET":         {},
	"AUDIT":       {},
	"SECMARK":     {},
	"CONNSECMARK": {},
	"TEE":         {},
	"SYNPROXY":    {},
	"HMARK":       {},
	"IDLETIMER":   {},
	"LED":         {},
	"RATEEST":     {},
}

// TargetHooks are the built-in chains an extension target may be reached
// from, nil if any.
func TargetHooks(name string) []string {
	if info := targets[name]; info != nil {
		return info.hooks
	}
	return nil
}

// maxChainName is the longest chain name iptables accepts
// (XT_EXTENSION_MAXNAMELEN - 1).
const maxChainName = 28

// checkChainName refuses what iptables refuses for a user chain's name:
// too long for the kernel, or that could be read as an option or a
// target.
func checkChainName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("empty chain name")
	case len(name) > maxChainName:
		return fmt.Errorf("invalid chain name `%s' (%d chars max)", name, maxChainName)
	case name[0] == '-' || name[0] == '!':
		return fmt.Errorf("invalid chain name `%s'", name)
	case strings.ContainsAny(name, " \t\"'"):
		return fmt.Errorf("invalid chain name `%s'", name)
	case targets[name] != nil || slices.Contains(verdicts, name):
		return fmt.Errorf("chain name `%s' may not clash with a target name", name)
	}
	return nil
}

func builtinOfAnyTable(name string) bool {
	for _, cs := range xtables.BuiltinChains {
		if slices.Contains(cs, name) {
			return true
		}
	}
	return false
}
