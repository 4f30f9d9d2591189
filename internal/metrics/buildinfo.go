package metrics

import (
	"fmt"
	"regexp"
	"runtime"
	"runtime/debug"

	apiversion "k8s.io/apimachinery/pkg/version"
	k8smetrics "k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

// buildInfo is component-base's kubernetes_build_info (the same name,
// help, stability and labels, registered in the same registry), but
// labelled with kproxy's version: component-base's own
// (k8s.io/component-base/metrics/prometheus/version) reads the build
// values Kubernetes' build scripts stamp into k8s.io/component-base/version
// with -ldflags -X, which a kproxy build does not set, so it exported
// git_version="v0.0.0-master+$Format:%H$" and build_date="1970-01-01T00:00:00Z".
var buildInfo = k8smetrics.NewGaugeVec(
	&k8smetrics.GaugeOpts{
		Name:           "kubernetes_build_info",
		Help:           "A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree state, build date, Go version, and compiler from which Kubernetes was built, and platform on which it is running.",
		StabilityLevel: k8smetrics.BETA,
	},
	[]string{"major", "minor", "git_version", "git_commit", "git_tree_state", "build_date", "go_version", "compiler", "platform"},
)

func init() {
	legacyregistry.MustRegister(buildInfo)
	SetBuildInfo(BuildInfo(""))
}

var majorMinor = regexp.MustCompile(`^v(\d+)\.(\d+)`)

// BuildInfo returns this binary's version information: gitVersion as given
// (kproxy's version; "" takes the main module's version Go recorded),
// major and minor parsed from it, the commit, tree state and commit time
// from the VCS stamp Go writes into binaries built in a git checkout
// (empty without one, e.g. with -buildvcs=false), and Go's version,
// compiler and platform.
func BuildInfo(gitVersion string) apiversion.Info {
	info := apiversion.Info{
		GitVersion: gitVersion,
		GoVersion:  runtime.Version(),
		Compiler:   runtime.Compiler,
		Platform:   fmt.Sprintf("%s/%s", runtime.GOOS, runtime.GOARCH),
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if info.GitVersion == "" {
			info.GitVersion = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.GitCommit = s.Value
			case "vcs.time":
				info.BuildDate = s.Value
			case "vcs.modified":
				info.GitTreeState = "clean"
				if s.Value == "true" {
					info.GitTreeState = "dirty"
				}
			}
		}
	}
	if m := majorMinor.FindStringSubmatch(info.GitVersion); m != nil {
		info.Major, info.Minor = m[1], m[2]
	}
	return info
}

// SetBuildInfo makes kubernetes_build_info say info (one series).
func SetBuildInfo(info apiversion.Info) {
	buildInfo.Reset()
	buildInfo.WithLabelValues(info.Major, info.Minor, info.GitVersion, info.GitCommit, info.GitTreeState, info.BuildDate, info.GoVersion, info.Compiler, info.Platform).Set(1)
}
