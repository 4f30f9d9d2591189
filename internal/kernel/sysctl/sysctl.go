// Package sysctl reads and writes integer kernel parameters: sysctls under
// /proc/sys and module parameters under /sys/module.
//
// Which network namespace a /proc/sys/net path means is decided when the
// file is opened: it is the namespace of the opening thread. The conntrack
// timeouts and nf_conntrack_tcp_be_liberal are per namespace;
// nf_conntrack_max is global and read-only outside the initial namespace;
// /sys/module/nf_conntrack/parameters/hashsize is global.
package sysctl

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Interface reads and writes one integer kernel parameter, named by its
// absolute path ("/proc/sys/net/netfilter/nf_conntrack_max").
type Interface interface {
	Get(path string) (int, error)
	Set(path string, value int) error
}

// Files is the real Interface: it reads and writes the files.
type Files struct{}

var _ Interface = Files{}

// Get reads path as a decimal integer.
func (Files) Get(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", path, err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", path, err)
	}
	return v, nil
}

// Set writes value to path.
func (Files) Set(path string, value int) error {
	// O_WRONLY without O_CREATE: a parameter that does not exist (module
	// not loaded) is an error, not a new file.
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("writing %s=%d: %w", path, value, err)
	}
	if _, err := f.WriteString(strconv.Itoa(value)); err != nil {
		f.Close()
		return fmt.Errorf("writing %s=%d: %w", path, value, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s=%d: %w", path, value, err)
	}
	return nil
}
