package main

import (
	"context"
	"errors"
	"sort"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/kube-proxy/config/v1alpha1"
)

// TestNodeEvents: the start Events reach the events.k8s.io API as upstream
// kube-proxy records them: about the Node, reporting controller
// kube-proxy, action StartKubeProxy.
func TestNodeEvents(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset()
	rec, stop := newEventRecorder(ctx, client)
	defer stop()

	ev := newNodeEvents(rec, "node-a")
	ev.defaultMode()
	ev.serverFailed(reasonFailedMetricsServer, errors.New("listen tcp 127.0.0.1:10249: bind: address already in use"))
	ev.serverFailed(reasonFailedHealthzServer, nil) // no error, no Event
	ev.starting()

	type want struct{ typ, reason, note string }
	wants := []want{
		{"Normal", "Starting", ""},
		{"Warning", "FailedToStartMetricServer", "listen tcp 127.0.0.1:10249: bind: address already in use"},
		{"Warning", "KubeProxyDefaultMode", defaultModeMessage},
	}
	var got []eventsv1.Event
	deadline := time.Now().Add(10 * time.Second)
	for {
		list, err := client.EventsV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got = list.Items
		if len(got) >= len(wants) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The broadcaster works asynchronously; give an unexpected fourth
	// Event a moment to show up.
	time.Sleep(100 * time.Millisecond)
	list, err := client.EventsV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got = list.Items
	if len(got) != len(wants) {
		t.Fatalf("got %d Events, want %d: %+v", len(got), len(wants), got)
	}
	sort.Slice(got, func(i, j int) bool { return got[i].Reason > got[j].Reason })
	sort.Slice(wants, func(i, j int) bool { return wants[i].reason > wants[j].reason })
	for i, e := range got {
		w := wants[i]
		if e.Type != w.typ || e.Reason != w.reason || e.Note != w.note {
			t.Errorf("Event %d: type %q reason %q note %q, want %q %q %q", i, e.Type, e.Reason, e.Note, w.typ, w.reason, w.note)
		}
		if e.Action != "StartKubeProxy" || e.ReportingController != "kube-proxy" {
			t.Errorf("Event %s: action %q controller %q, want StartKubeProxy kube-proxy", e.Reason, e.Action, e.ReportingController)
		}
		if r := e.Regarding; r.Kind != "Node" || r.APIVersion != "v1" || r.Name != "node-a" || r.Namespace != "" {
			t.Errorf("Event %s regards %+v, want the Node node-a", e.Reason, r)
		}
	}
}

// TestNodeEventsWithoutAPIServer: with the file source there is no
// recorder, and nothing is recorded (nor panics).
func TestNodeEventsWithoutAPIServer(t *testing.T) {
	ev := newNodeEvents(nil, "node-a")
	ev.starting()
	ev.defaultMode()
	ev.serverFailed(reasonFailedHealthzServer, errors.New("boom"))
}

// TestSetUpEvents: KubeProxyDefaultMode is recorded only when no mode is
// configured, and only with an API client.
func TestSetUpEvents(t *testing.T) {
	for _, tc := range []struct {
		mode    v1alpha1.ProxyMode
		reasons []string
	}{
		{mode: "", reasons: []string{"KubeProxyDefaultMode"}},
		{mode: "iptables"},
		{mode: "nftables"},
	} {
		t.Run("mode "+string(tc.mode), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			client := fake.NewClientset()
			c := &v1alpha1.KubeProxyConfiguration{Mode: tc.mode}
			rec, _, stop := setUpEvents(ctx, client, c, "node-a")
			defer stop()
			if rec == nil {
				t.Fatal("no recorder with an API client")
			}
			var got []string
			deadline := time.Now().Add(5 * time.Second)
			settle := time.Now().Add(300 * time.Millisecond)
			for time.Now().Before(deadline) {
				list, err := client.EventsV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
				if err != nil {
					t.Fatal(err)
				}
				got = got[:0]
				for _, e := range list.Items {
					got = append(got, e.Reason)
				}
				if len(got) >= len(tc.reasons) && time.Now().After(settle) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if strings.Join(got, ",") != strings.Join(tc.reasons, ",") {
				t.Errorf("Events %v, want %v", got, tc.reasons)
			}
		})
	}
	// No API client (file source): no recorder, nothing to stop.
	rec, ev, stop := setUpEvents(context.Background(), nil, &v1alpha1.KubeProxyConfiguration{}, "node-a")
	defer stop()
	if rec != nil {
		t.Error("recorder without an API client")
	}
	ev.starting()
}
