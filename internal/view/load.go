package view

import (
	"fmt"
	"io"
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/source/file"
)

// DefaultExampleNode is the example's node that render shows by default.
const DefaultExampleNode = "node-a"

// Cluster is a cluster snapshot run through the proxy's model for one
// node: what `kproxy render` and `kproxy trace` show.
type Cluster struct {
	States   []*model.State
	Node     *model.Node
	NodeName string
	Skipped  []SkippedEntry
}

// NodeNotChosenError: the snapshot has several nodes and none was named.
type NodeNotChosenError struct{ Nodes int }

func (e *NodeNotChosenError) Error() string {
	return fmt.Sprintf("--hostname-override is required: the snapshot has %d nodes", e.Nodes)
}

// Load reads a snapshot file or directory (the built-in example when path
// is empty) and builds the model for hostnameOverride's node (the only
// node of the snapshot, or the example's DefaultExampleNode, when it is
// empty), as the proxy would. Problems with single objects are written to
// errOut as warnings. For the example, c's clusterCIDR is set to the
// example's when empty: without it nothing would count as pod traffic.
func Load(errOut io.Writer, c *v1alpha1.KubeProxyConfiguration, path string) (*Cluster, error) {
	var objs *file.Objects
	var errs []error
	if path == "" {
		objs = example.Objects()
		if c.ClusterCIDR == "" {
			c.ClusterCIDR = strings.Join(example.ClusterCIDRs, ",")
		}
	} else {
		objs, errs = file.Load(path)
	}
	for _, err := range errs {
		fmt.Fprintln(errOut, "warning:", err)
	}
	if objs == nil {
		return nil, fmt.Errorf("no usable objects in %s", path)
	}
	nodeName := config.NormalizeHostname(c.HostnameOverride)
	if nodeName == "" {
		if path == "" {
			nodeName = DefaultExampleNode
		} else if len(objs.Nodes) == 1 {
			nodeName = objs.Nodes[0].Name
		} else {
			return nil, &NodeNotChosenError{Nodes: len(objs.Nodes)}
		}
	}
	fams := []v1.IPFamily{model.IPv4, model.IPv6}
	cl := &Cluster{NodeName: nodeName}
	tracker := model.NewTracker(model.TrackerOptions{
		Hostname: nodeName,
		Families: fams,
		OnInvalid: func(e *model.InvalidError) {
			cl.Skipped = append(cl.Skipped, SkippedEntry{Object: e.Kind + " " + e.Object, Reason: e.Field + ": " + e.Reason})
		},
	})
	objs.Feed(tracker)
	for _, s := range objs.Services {
		if why := model.SkipService(s); why != "" && len(model.ValidateService(s)) == 0 {
			cl.Skipped = append(cl.Skipped, SkippedEntry{Object: "Service " + s.Namespace + "/" + s.Name, Reason: why})
		}
	}
	u := tracker.Take()
	for _, f := range fams {
		st := model.NewState(f)
		st.Apply(u.Families[f])
		cl.States = append(cl.States, st)
	}
	cl.Node = tracker.Node()
	if cl.Node == nil {
		fmt.Fprintf(errOut, "warning: node %q is not in the snapshot: no zone, pod CIDRs or addresses known\n", nodeName)
	}
	return cl, nil
}

// LocalAddrs stand in for a fresh node's local addresses: those of its
// Node object, as far as the snapshot knows them.
func (cl *Cluster) LocalAddrs() []netip.Addr {
	if cl.Node == nil {
		return nil
	}
	return cl.Node.Addresses
}

// Model is the model view of the cluster (WriteTable, or YAML and JSON).
func (cl *Cluster) Model() *Snapshot {
	v := Build(cl.States, cl.Node, cl.NodeName)
	v.Skipped = cl.Skipped
	return v
}
