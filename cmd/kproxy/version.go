package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	apiversion "k8s.io/apimachinery/pkg/version"

	"github.com/kproxy/kproxy/internal/metrics"
)

// versionFlag is --version as component-base's verflag defines it for
// kube-proxy: "--version" (or =true) prints "kproxy <version>" and exits,
// "--version=raw" prints the version struct, "--version=vX.Y.Z" sets the
// reported version, "--version=false" does nothing.
type versionFlag string

func (v *versionFlag) IsBoolFlag() bool { return true }
func (v *versionFlag) String() string   { return string(*v) }
func (v *versionFlag) Type() string     { return "version" }

func (v *versionFlag) Set(s string) error {
	if s == "raw" {
		*v = "raw"
		return nil
	}
	if strings.HasPrefix(s, "v") {
		// verflag's SetDynamicVersion: the reported version changes,
		// nothing is printed.
		version = s
		*v = "false"
		return nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	*v = versionFlag(strconv.FormatBool(b))
	return nil
}

func addVersionFlag(fs *pflag.FlagSet) *versionFlag {
	v := versionFlag("false")
	fs.Var(&v, "version", "--version, --version=raw prints version information and quits; --version=vX.Y.Z... sets the reported version")
	fs.Lookup("version").NoOptDefVal = "true"
	return &v
}

// print writes the version as verflag.PrintAndExitIfRequested does and
// reports whether it did (the caller then exits 0).
func (v *versionFlag) print(w io.Writer) bool {
	switch *v {
	case "raw":
		fmt.Fprintf(w, "%#v\n", versionInfo())
		return true
	case "true":
		fmt.Fprintf(w, "kproxy %s\n", version)
		return true
	}
	return false
}

// versionInfo is what --version=raw prints and kubernetes_build_info
// says: kproxy's version, and the commit and Go toolchain it was built from.
func versionInfo() apiversion.Info { return metrics.BuildInfo(version) }
