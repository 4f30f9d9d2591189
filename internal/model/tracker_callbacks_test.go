package model

// The tracker's signals to its consumer (Synced, OnChange) and its
// locking: callbacks run without the lock, and events from several
// goroutines all reach the consumer. Addresses as in tracker_test.go.

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

func TestTrackerSynced(t *testing.T) {
	changes := 0
	tr := NewTracker(TrackerOptions{OnChange: func() { changes++ }})
	if tr.HasSynced() {
		t.Errorf("HasSynced() before Synced = true")
	}
	tr.Synced()
	if !tr.HasSynced() {
		t.Errorf("HasSynced() after Synced = false")
	}
	if changes != 1 {
		t.Errorf("Synced called OnChange %d times, want 1", changes)
	}
	if !tr.Take().Empty() {
		t.Errorf("Synced alone is a change")
	}
	if got := tr.Families(); !slices.Equal(got, []v1.IPFamily{IPv4}) {
		t.Errorf("default Families() = %v, want [IPv4]", got)
	}
}

// TestTrackerCallbacksMayCallBack checks that the callbacks run without the
// tracker's lock: a callback that asks the tracker something must not hang.
func TestTrackerCallbacksMayCallBack(t *testing.T) {
	var tr *Tracker
	calls := 0
	callBack := func() {
		calls++
		tr.Pending()
		tr.HasSynced()
	}
	tr = NewTracker(TrackerOptions{
		Hostname:  thisNode,
		OnChange:  callBack,
		OnInvalid: func(*InvalidError) { callBack() },
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tr.ServiceUpdated(makeService(testNS, "a", func(s *v1.Service) { s.Spec.ExternalIPs = []string{"bad"} }))
		tr.EndpointSliceUpdated(makeSlice(testNS, "a", "a-1", discovery.AddressTypeIPv4, func(s *discovery.EndpointSlice) {
			s.Endpoints = []discovery.Endpoint{sliceEP("bad")}
		}))
		tr.NodeUpdated(makeNode(thisNode, func(n *v1.Node) { n.Spec.PodCIDRs = []string{"bad"} }))
		tr.Synced()
		tr.Take()
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("a callback that calls the tracker deadlocked (after %d calls)", calls)
	}
	// OnChange for each of the 4 events; OnInvalid for the service, the
	// node and (at Take) the slice.
	if calls != 7 {
		t.Errorf("callbacks called %d times, want 7", calls)
	}
}

// TestTrackerConcurrent feeds events from several goroutines while another
// takes updates; run with -race. In the end every service and endpoint must
// have reached the consumer exactly as last sent.
func TestTrackerConcurrent(t *testing.T) {
	tr := NewTracker(TrackerOptions{Hostname: thisNode, OnChange: func() {}})
	state := NewState(IPv4)
	const workers, services = 4, 25
	stop := make(chan struct{})
	taken := make(chan struct{})
	go func() {
		defer close(taken)
		for {
			select {
			case <-stop:
				state.Apply(tr.Take().Families[IPv4])
				return
			default:
				state.Apply(tr.Take().Families[IPv4])
			}
		}
	}()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range services {
				name := fmt.Sprintf("w%d-s%d", w, i)
				ip := fmt.Sprintf("198.19.%d.%d", w, i+1)
				tr.ServiceUpdated(makeService(testNS, name, func(s *v1.Service) { s.Spec.ClusterIPs = []string{ip} }))
				tr.EndpointSliceUpdated(makeSlice(testNS, name, name+"-1", discovery.AddressTypeIPv4, func(s *discovery.EndpointSlice) {
					s.Endpoints = []discovery.Endpoint{sliceEP(fmt.Sprintf("198.18.%d.%d", w+1, i+1))}
				}))
				if i%5 == 0 {
					tr.ServiceDeleted(makeService(testNS, name, nil))
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-taken
	var wantServices, gotServices []string
	for w := range workers {
		for i := range services {
			if i%5 != 0 {
				wantServices = append(wantServices, fmt.Sprintf("ns/w%d-s%d:http/TCP 198.19.%d.%d", w, i, w, i+1))
			}
		}
	}
	for n, sp := range state.Services {
		gotServices = append(gotServices, fmt.Sprintf("%s %s", n, sp.ClusterIP))
	}
	slices.Sort(wantServices)
	slices.Sort(gotServices)
	if diff := cmp.Diff(wantServices, gotServices); diff != "" {
		t.Errorf("services after all updates (-want +got):\n%s", diff)
	}
	if got, want := len(state.Endpoints), workers*services; got != want {
		t.Errorf("%d ports with endpoints, want %d", got, want)
	}
}
