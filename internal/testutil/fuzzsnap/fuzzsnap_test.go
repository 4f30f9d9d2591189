package fuzzsnap

import (
	"testing"

	"github.com/kproxy/kproxy/internal/model"
)

// TestSlicesAreValid: most of the snapshot's EndpointSlices pass the API
// server's validation (the bytes may make some invalid on purpose: an
// unknown address type, duplicate port names), or the model drops them
// all and the fuzz targets only ever see the directly added port. Slice
// names once carried the address type in capitals, "s0-IPv4", and did
// just that.
func TestSlicesAreValid(t *testing.T) {
	slices, valid := 0, 0
	for _, seed := range Seeds(40) {
		s := Build(seed, "web")
		for _, sl := range s.Slices {
			slices++
			errs := model.ValidateEndpointSlice(sl)
			if len(errs) == 0 {
				valid++
			}
			for _, e := range errs {
				if e.Category == model.ReasonName {
					t.Errorf("slice %s/%s: %v", sl.Namespace, sl.Name, e)
				}
			}
		}
	}
	if valid*2 < slices {
		t.Fatalf("%d of %d slices valid, want most", valid, slices)
	}
}
