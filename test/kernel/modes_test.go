package kernel

import "testing"

// modes are the proxy modes every feature test runs in. Each test runs once
// per mode, in its own cluster of namespaces, as a parallel subtest named
// after the mode.
var modes = []proxyMode{nftablesMode}

// forEachMode runs f once per proxy mode.
func forEachMode(t *testing.T, f func(t *testing.T, m proxyMode)) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			f(t, m)
		})
	}
}
