package model

// Trigger times: when the change behind an EndpointSlice was made, as the
// tracker hands it to the consumer, per IP family. Addresses as in
// tracker_test.go.

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

func TestTrackerTriggerTimes(t *testing.T) {
	v4 := discovery.AddressTypeIPv4
	// The tracker is made by runTrackerSteps after this; times before it
	// are from before the proxy started and must not count (upstream does
	// the same, or the first sync would report hours of latency).
	start := time.Now()
	t1, t2 := start.Add(time.Hour).UTC().Truncate(time.Second), start.Add(2*time.Hour).UTC().Truncate(time.Second)
	old := start.Add(-time.Hour).UTC()
	slice := func(svc, name string, tt *time.Time) *discovery.EndpointSlice {
		return makeSlice(testNS, svc, name, v4, func(s *discovery.EndpointSlice) {
			if tt != nil {
				s.Annotations = map[string]string{AnnotationTriggerTime: tt.Format(time.RFC3339Nano)}
			}
			s.Endpoints = []discovery.Endpoint{sliceEP("198.18.1.1")}
		})
	}
	steps := []trackerStep{{
		name: "earliest time per service is kept",
		do: func(tr *Tracker) {
			tr.EndpointSliceUpdated(slice("a", "a-1", &t2))
			tr.EndpointSliceUpdated(slice("a", "a-2", &t1))
			tr.EndpointSliceUpdated(slice("a", "a-1", &t2))
			tr.EndpointSliceUpdated(slice("b", "b-1", &t2))
		},
		wantOnChange: 4,
		want: summary{
			EndpointChanges: 4,
			Endpoints:       map[string][]string{"IPv4 ns/a:http/TCP": {"198.18.1.1:8080"}, "IPv4 ns/b:http/TCP": {"198.18.1.1:8080"}},
			Triggers:        map[string]time.Time{"IPv4 ns/a": t1, "IPv4 ns/b": t2},
		},
		wantApplied: map[v1.IPFamily][]string{IPv4: {"ns/a:http/TCP", "ns/b:http/TCP"}},
	}, {
		name:         "times are reset by Take",
		do:           func(tr *Tracker) { tr.EndpointSliceUpdated(slice("a", "a-1", &t2)) },
		wantOnChange: 1,
		want: summary{
			EndpointChanges: 1,
			Endpoints:       map[string][]string{"IPv4 ns/a:http/TCP": {"198.18.1.1:8080"}},
			Triggers:        map[string]time.Time{"IPv4 ns/a": t2},
		},
	}, {
		name: "times from before the tracker started and missing times are ignored",
		do: func(tr *Tracker) {
			tr.EndpointSliceUpdated(slice("a", "a-1", &old))
			tr.EndpointSliceUpdated(slice("b", "b-1", nil))
		},
		wantOnChange: 2,
		want: summary{
			EndpointChanges: 2,
			Endpoints:       map[string][]string{"IPv4 ns/a:http/TCP": {"198.18.1.1:8080"}, "IPv4 ns/b:http/TCP": {"198.18.1.1:8080"}},
		},
	}, {
		// A deleted slice's annotation tells when it was last written, not
		// when it was deleted: upstream drops the service's times then.
		name: "deleting a slice drops the service's times",
		do: func(tr *Tracker) {
			tr.EndpointSliceUpdated(slice("a", "a-1", &t1))
			tr.EndpointSliceDeleted(slice("a", "a-2", &t1))
			tr.EndpointSliceUpdated(slice("b", "b-1", &t1))
		},
		wantOnChange: 3,
		want: summary{
			EndpointChanges: 3,
			Endpoints:       map[string][]string{"IPv4 ns/a:http/TCP": {"198.18.1.1:8080"}, "IPv4 ns/b:http/TCP": {"198.18.1.1:8080"}},
			Triggers:        map[string]time.Time{"IPv4 ns/b": t1},
		},
	}}
	runTrackerSteps(t, v4Only, steps)
}

// TestTrackerTriggerTimesPerFamily: a slice's trigger time counts in the
// family of its address type only, and deleting a slice of one family
// keeps the other family's time (upstream's change tracker per family).
func TestTrackerTriggerTimesPerFamily(t *testing.T) {
	t1 := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	slice := func(name string, at discovery.AddressType, addr string) *discovery.EndpointSlice {
		return makeSlice(testNS, "a", name, at, func(s *discovery.EndpointSlice) {
			s.Annotations = map[string]string{AnnotationTriggerTime: t1.Format(time.RFC3339Nano)}
			s.Endpoints = []discovery.Endpoint{sliceEP(addr)}
		})
	}
	v4, v6 := slice("a-4", discovery.AddressTypeIPv4, "198.18.1.1"), slice("a-6", discovery.AddressTypeIPv6, "fd00:18::1")
	eps := func(f v1.IPFamily) map[string][]string {
		if f == IPv4 {
			return map[string][]string{"IPv4 ns/a:http/TCP": {"198.18.1.1:8080"}}
		}
		return map[string][]string{"IPv6 ns/a:http/TCP": {"[fd00:18::1]:8080"}}
	}
	steps := []trackerStep{{
		name:         "IPv4 slice: IPv4 only",
		do:           func(tr *Tracker) { tr.EndpointSliceUpdated(v4) },
		wantOnChange: 1,
		want:         summary{EndpointChanges: 1, Endpoints: eps(IPv4), Triggers: map[string]time.Time{"IPv4 ns/a": t1}},
		wantApplied:  map[v1.IPFamily][]string{IPv4: {"ns/a:http/TCP"}},
	}, {
		name:         "IPv6 slice: IPv6 only",
		do:           func(tr *Tracker) { tr.EndpointSliceUpdated(v6) },
		wantOnChange: 1,
		want:         summary{EndpointChanges: 1, Endpoints: merge(eps(IPv4), eps(IPv6)), Triggers: map[string]time.Time{"IPv6 ns/a": t1}},
		wantApplied:  map[v1.IPFamily][]string{IPv6: {"ns/a:http/TCP"}},
	}, {
		name: "deleting the IPv6 slice keeps the IPv4 time",
		do: func(tr *Tracker) {
			tr.EndpointSliceUpdated(v4)
			tr.EndpointSliceDeleted(v6)
		},
		wantOnChange: 2,
		want:         summary{EndpointChanges: 2, Endpoints: merge(eps(IPv4), map[string][]string{"IPv6 ns/a:http/TCP": nil}), Triggers: map[string]time.Time{"IPv4 ns/a": t1}},
		wantApplied:  map[v1.IPFamily][]string{IPv6: {"ns/a:http/TCP"}},
	}}
	runTrackerSteps(t, dualNode, steps)
}

// merge returns the union of two endpoint summaries.
func merge(a, b map[string][]string) map[string][]string {
	out := map[string][]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}
