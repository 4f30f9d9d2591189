// Package guest is the part of the test VM that runs inside it: the Config
// the host packs into the initramfs, the marker lines the init prints on
// the console, modules.dep resolution (shared with the host, which uses it
// to pick the modules the initramfs needs), and Main, the init itself.
package guest

import (
	"fmt"
	"strconv"
	"strings"
)

// ConfigPath is where the host puts the JSON Config inside the initramfs.
const ConfigPath = "/kproxy-vm.json"

// ModulesDir is the initramfs directory holding the .ko files the init loads
// before it can mount the host's root (virtio PCI and 9p).
const ModulesDir = "/modules"

// MountTag is the virtio-9p tag of the host's root file system.
const MountTag = "hostroot"

// Config is what the init is asked to do.
type Config struct {
	// Nonce is part of every marker line, so that a command printing a
	// marker-like line cannot fake the result.
	Nonce string `json:"nonce"`
	// InitrdModules are .ko paths inside the initramfs, already in load
	// order (dependencies first).
	InitrdModules []string `json:"initrdModules,omitempty"`
	// ModulesRoot is the host directory that holds lib/modules/<release>
	// of the guest kernel (with its modules.dep); the guest sees it through
	// the host's root. Autoloads run `modprobe -d ModulesRoot`.
	ModulesRoot string `json:"modulesRoot"`
	// Release is the guest kernel's release (uname -r).
	Release string `json:"release"`
	// Modules are loaded (with their dependencies) before the command runs,
	// for what the kernel does not autoload (br_netfilter).
	Modules []string `json:"modules,omitempty"`
	// Tmpfs are directories of the host's root that get a fresh, writable
	// tmpfs in the guest (the host's root is mounted read-only).
	Tmpfs []string `json:"tmpfs,omitempty"`
	// Binds are host paths under a Tmpfs directory that stay visible at the
	// same path (read-only), such as the test binary in the host's /tmp.
	Binds []string `json:"binds,omitempty"`
	// Argv, Env and Dir are the command run after the switch to the host's
	// root. Dir falls back to / when the guest lacks it.
	Argv []string `json:"argv"`
	Env  []string `json:"env,omitempty"`
	Dir  string   `json:"dir,omitempty"`
	// Debug prints each setup step.
	Debug bool `json:"debug,omitempty"`
}

// Marker lines, each alone on a console line:
//
//	kproxy-vm:<nonce>:ready            the command is about to start
//	kproxy-vm:<nonce>:exit:<code>      the command ended with <code>
//	kproxy-vm:<nonce>:error:<message>  the init failed before or around it
const markerPrefix = "kproxy-vm:"

// Marker kinds.
const (
	MarkReady = "ready"
	MarkExit  = "exit"
	MarkError = "error"
)

// MarkerPrefix is how every marker line of nonce starts.
func MarkerPrefix(nonce string) string { return markerPrefix + nonce + ":" }

// ReadyLine, ExitLine and ErrorLine format marker lines (without newline).
func ReadyLine(nonce string) string { return MarkerPrefix(nonce) + MarkReady }

// ExitLine reports the command's exit code.
func ExitLine(nonce string, code int) string {
	return MarkerPrefix(nonce) + MarkExit + ":" + strconv.Itoa(code)
}

// ErrorLine reports a failure of the init; newlines are flattened so the
// message stays one line.
func ErrorLine(nonce string, err error) string {
	msg := strings.ReplaceAll(err.Error(), "\n", " | ")
	return MarkerPrefix(nonce) + MarkError + ":" + msg
}

// ParseMarker recognises a marker line of nonce. It returns the kind and the
// rest (exit code or message); ok is false for any other line.
func ParseMarker(line, nonce string) (kind, rest string, ok bool) {
	s, found := strings.CutPrefix(line, MarkerPrefix(nonce))
	if !found {
		return "", "", false
	}
	kind, rest, _ = strings.Cut(s, ":")
	switch kind {
	case MarkReady, MarkExit, MarkError:
		return kind, rest, true
	}
	return "", "", false
}

// ParseExit parses the rest of an exit marker.
func ParseExit(rest string) (int, error) {
	code, err := strconv.Atoi(rest)
	if err != nil {
		return 0, fmt.Errorf("bad exit marker %q: %w", rest, err)
	}
	return code, nil
}
