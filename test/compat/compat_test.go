package compat

import "testing"

// TestCompatibility runs every comparison, then checks docs/compatibility.md.
func TestCompatibility(t *testing.T) {
	needBinaries(t)
	t.Run("flags", testFlags)
	t.Run("gates", testGates)
	t.Run("live", testLive)
	checkDoc(t)
}
