package view

// The built-in example: nodes node-a and node-b in 198.18.0.0/16, pods in
// its cluster CIDRs, services in 198.19.0.0/16.

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/example"
)

// TestLoad: the example is shown for node-a unless another node is named,
// with the example's cluster CIDRs; a file with several nodes needs one
// named.
func TestLoad(t *testing.T) {
	c := config.NewOptions().Config
	var warn bytes.Buffer
	cl, err := Load(&warn, c, "")
	if err != nil {
		t.Fatal(err)
	}
	if cl.NodeName != DefaultExampleNode || cl.Node == nil || len(cl.States) != 2 || len(cl.LocalAddrs()) == 0 {
		t.Errorf("example: node %q (%v), %d families, local %v", cl.NodeName, cl.Node, len(cl.States), cl.LocalAddrs())
	}
	if c.ClusterCIDR != strings.Join(example.ClusterCIDRs, ",") {
		t.Errorf("clusterCIDR %q, want the example's", c.ClusterCIDR)
	}
	c.HostnameOverride = "Node-B"
	if cl, err = Load(&warn, c, ""); err != nil || cl.NodeName != "node-b" {
		t.Errorf("--hostname-override Node-B: %v, %v", cl, err)
	}
	if warn.Len() != 0 {
		t.Errorf("warnings for the example: %s", warn.String())
	}

	var b bytes.Buffer
	for _, n := range example.Objects().Nodes {
		y, err := yaml.Marshal(n)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString("---\napiVersion: v1\nkind: Node\n")
		b.Write(y)
	}
	path := filepath.Join(t.TempDir(), "nodes.yaml")
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	c.HostnameOverride = ""
	var nc *NodeNotChosenError
	if _, err := Load(&warn, c, path); !errors.As(err, &nc) || nc.Nodes != 2 {
		t.Errorf("two nodes, none named: %v, want a NodeNotChosenError for 2 nodes", err)
	}
}
