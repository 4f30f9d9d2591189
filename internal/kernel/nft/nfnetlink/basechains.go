package nfnetlink

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

// BaseChain is a chain hooked into the packet path, of any table and
// family: what `kproxy doctor` lists of other netfilter users.
type BaseChain struct {
	Family   nft.Family
	Table    string
	Name     string
	Type     string // filter, nat, route
	Hook     string // prerouting, input, forward, output, postrouting, ingress, egress
	Priority int32
	// Drop: the chain's policy is drop (packets that no rule accepts are
	// dropped).
	Drop bool
}

func (b BaseChain) String() string {
	policy := "accept"
	if b.Drop {
		policy = "drop"
	}
	return fmt.Sprintf("%s %s/%s: type %s hook %s priority %d policy %s", b.Family, b.Table, b.Name, b.Type, b.Hook, b.Priority, policy)
}

// hookName names a hook number as nft does, by family.
func hookName(fam nft.Family, n uint32) string {
	switch fam {
	case "netdev":
		if n == 0 {
			return "ingress"
		}
		return "egress"
	case "arp":
		return [...]string{"input", "output", "forward"}[min(n, 2)]
	}
	names := []string{"prerouting", "input", "forward", "output", "postrouting", "ingress"}
	if int(n) < len(names) {
		return names[n]
	}
	return fmt.Sprintf("hook-%d", n)
}

// ListBaseChains lists every base chain of every table and family,
// sorted by family, hook and priority.
func (n *Netlink) ListBaseChains(ctx context.Context) ([]BaseChain, error) {
	c, err := n.dial()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	var out []BaseChain
	err = c.dumpFamilies(ctx, unix.NFT_MSG_GETCHAIN, unix.NFPROTO_UNSPEC, nil, func(family uint8, b []byte) bool {
		ch := BaseChain{Family: familyName(family)}
		hooked := false
		forEachAttr(b, func(typ uint16, data []byte) {
			switch typ {
			case unix.NFTA_CHAIN_TABLE:
				ch.Table = cString(data)
			case unix.NFTA_CHAIN_NAME:
				ch.Name = cString(data)
			case unix.NFTA_CHAIN_TYPE:
				ch.Type = cString(data)
			case unix.NFTA_CHAIN_POLICY:
				if len(data) >= 4 {
					ch.Drop = binary.BigEndian.Uint32(data) == 0 // NF_DROP
				}
			case unix.NFTA_CHAIN_HOOK:
				hooked = true
				forEachAttr(data, func(t uint16, d []byte) {
					if len(d) < 4 {
						return
					}
					switch t {
					case unix.NFTA_HOOK_HOOKNUM:
						ch.Hook = hookName(ch.Family, binary.BigEndian.Uint32(d))
					case unix.NFTA_HOOK_PRIORITY:
						ch.Priority = int32(binary.BigEndian.Uint32(d))
					}
				})
			}
		})
		if hooked {
			// The family is known only once all attributes are read.
			out = append(out, ch)
		}
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("nft: listing base chains: %w", err)
	}
	slices.SortFunc(out, func(a, b BaseChain) int {
		if c := strings.Compare(string(a.Family), string(b.Family)); c != 0 {
			return c
		}
		if c := strings.Compare(a.Hook, b.Hook); c != 0 {
			return c
		}
		if a.Priority != b.Priority {
			return int(a.Priority) - int(b.Priority)
		}
		return strings.Compare(a.Table+"/"+a.Name, b.Table+"/"+b.Name)
	})
	return out, nil
}
