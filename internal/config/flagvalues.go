package config

import (
	"fmt"
	"net"
	"strings"

	netutils "k8s.io/utils/net"
)

// stringValue is a pflag.Value over a string-kinded field (ProxyMode,
// LocalMode), which accepts anything: Validate judges the value, so a bad
// one is reported together with every other problem.
type stringValue[T ~string] struct {
	p   *T
	typ string
}

func (v stringValue[T]) String() string     { return string(*v.p) }
func (v stringValue[T]) Set(s string) error { *v.p = T(s); return nil }
func (v stringValue[T]) Type() string       { return v.typ }

// ipValue is upstream's IPVar: a flag that must hold an IP address.
type ipValue struct{ p *string }

func (v ipValue) String() string { return *v.p }
func (v ipValue) Type() string   { return "ip" }
func (v ipValue) Set(s string) error {
	if netutils.ParseIPSloppy(s) == nil {
		return fmt.Errorf("%q is not a valid IP address", s)
	}
	*v.p = s
	return nil
}

// ipPortValue is upstream's IPPortVar: "", an IP, or IP:port.
type ipPortValue struct{ p *string }

func (v ipPortValue) String() string { return *v.p }
func (v ipPortValue) Type() string   { return "ipport" }
func (v ipPortValue) Set(s string) error {
	if strings.TrimSpace(s) == "" {
		*v.p = ""
		return nil
	}
	if netutils.ParseIPSloppy(s) != nil {
		*v.p = s
		return nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%q is not in a valid format (ip or ip:port): %w", s, err)
	}
	if netutils.ParseIPSloppy(host) == nil {
		return fmt.Errorf("%q is not a valid IP address", host)
	}
	if _, err := netutils.ParsePort(port, true); err != nil {
		return fmt.Errorf("%q is not a valid port number", port)
	}
	*v.p = s
	return nil
}
