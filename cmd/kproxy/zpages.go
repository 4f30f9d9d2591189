package main

import (
	"github.com/spf13/pflag"
	"k8s.io/component-base/featuregate"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/server"
)

// flagzValues returns what /flagz shows: every flag of the command and its
// value as parsed, a flag annotated "classified" hidden, as upstream's
// NamedFlagSetsReader.
func flagzValues(fs *pflag.FlagSet) func() map[string]string {
	return func() map[string]string {
		out := map[string]string{}
		fs.VisitAll(func(f *pflag.Flag) {
			if f.Value == nil {
				return
			}
			v := f.Value.String()
			if set, ok := f.Annotations["classified"]; ok && len(set) > 0 {
				v = "CLASSIFIED"
			}
			out[f.Name] = v
		})
		return out
	}
}

// withZpages adds /flagz and /statusz to the metrics server's config when
// their gates are on, as upstream.
func withZpages(cfg server.MetricsServerConfig, gates featuregate.FeatureGate, fs *pflag.FlagSet) server.MetricsServerConfig {
	if gates.Enabled(config.ComponentFlagz) && fs != nil {
		cfg.Flagz = flagzValues(fs)
	}
	if gates.Enabled(config.ComponentStatusz) {
		cfg.Statusz = &server.StatuszInfo{BinaryVersion: version, EmulationVersion: config.KubernetesVersion}
	}
	return cfg
}
