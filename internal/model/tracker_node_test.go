package model

// The tracker's view of this node: its Node object in updates, and the
// last one seen.

import (
	"testing"

	v1 "k8s.io/api/core/v1"
)

func TestTrackerNode(t *testing.T) {
	labelled := func(zone string) *v1.Node {
		return makeNode(thisNode, func(n *v1.Node) { n.Labels = map[string]string{v1.LabelTopologyZone: zone} })
	}
	steps := []trackerStep{{
		name: "another node is ignored",
		do: func(tr *Tracker) {
			tr.NodeUpdated(makeNode("node-b", nil))
			tr.NodeDeleted(makeNode("node-b", nil))
		},
		want: summary{Empty: true},
	}, {
		name:         "this node added",
		do:           func(tr *Tracker) { tr.NodeUpdated(labelled("zone-a")) },
		wantOnChange: 1,
		want:         summary{Node: thisNode},
	}, {
		name: "this node updated twice: the last one is sent",
		do: func(tr *Tracker) {
			tr.NodeUpdated(labelled("zone-b"))
			tr.NodeUpdated(labelled("zone-c"))
		},
		wantOnChange: 2,
		want:         summary{Node: thisNode},
	}, {
		name:         "this node deleted",
		do:           func(tr *Tracker) { tr.NodeDeleted(labelled("zone-c")) },
		wantOnChange: 1,
		want:         summary{NodeDeleted: true},
	}, {
		name: "deleted and created again before a Take",
		do: func(tr *Tracker) {
			tr.NodeDeleted(labelled("zone-c"))
			tr.NodeUpdated(labelled("zone-d"))
		},
		wantOnChange: 2,
		want:         summary{Node: thisNode},
	}, {
		name: "created and deleted before a Take",
		do: func(tr *Tracker) {
			tr.NodeUpdated(labelled("zone-e"))
			tr.NodeDeleted(labelled("zone-e"))
		},
		wantOnChange: 2,
		want:         summary{NodeDeleted: true},
	}, {
		name: "invalid parts are reported",
		do: func(tr *Tracker) {
			tr.NodeUpdated(makeNode(thisNode, func(n *v1.Node) { n.Spec.PodCIDRs = []string{"x"} }))
		},
		wantOnChange: 1,
		wantInvalid:  []string{"spec.podCIDRs[0]"},
		want:         summary{Node: thisNode},
	}}
	tr := runTrackerSteps(t, v4Only, steps)
	if n := tr.Node(); n == nil || n.Name != thisNode || len(n.PodCIDRs) != 0 {
		t.Errorf("Node() = %+v, want the last one seen", n)
	}
}

func TestTrackerNodeValue(t *testing.T) {
	tr := NewTracker(TrackerOptions{Hostname: thisNode})
	if tr.Node() != nil {
		t.Fatalf("Node() before any event = %v, want nil", tr.Node())
	}
	tr.NodeUpdated(makeNode(thisNode, func(n *v1.Node) { n.Labels = map[string]string{v1.LabelTopologyZone: "zone-a"} }))
	if z := tr.Take().Node.Zone(); z != "zone-a" {
		t.Errorf("Take().Node.Zone() = %q, want zone-a", z)
	}
	if z := tr.Node().Zone(); z != "zone-a" {
		t.Errorf("Node().Zone() = %q, want zone-a", z)
	}
	tr.NodeDeleted(makeNode(thisNode, nil))
	if tr.Node() != nil {
		t.Errorf("Node() after deletion = %v, want nil", tr.Node())
	}
}
