package main

// Addresses: 198.18.0.10 the node, 198.18.1.x pods, 198.19.0.x cluster IPs.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/view"
)

// contestedYAML holds shop/web and three newer services that claim its
// cluster IP and port, its node port, and its cluster IP as an external IP.
// The intruders sort before shop/web by name.
const contestedYAML = `apiVersion: v1
kind: Node
metadata: {name: node-a}
status: {addresses: [{type: InternalIP, address: 198.18.0.10}]}
---
apiVersion: v1
kind: Service
metadata: {namespace: shop, name: web, creationTimestamp: "2026-01-01T00:00:00Z"}
spec: {type: NodePort, clusterIP: 198.19.0.10, ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080}]}
---
apiVersion: v1
kind: Service
metadata: {namespace: aaa, name: cip, creationTimestamp: "2026-02-01T00:00:00Z"}
spec: {clusterIP: 198.19.0.10, ports: [{name: http, port: 80, targetPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {namespace: aaa, name: np, creationTimestamp: "2026-02-01T00:00:00Z"}
spec: {type: NodePort, clusterIP: 198.19.0.11, ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080}]}
---
apiVersion: v1
kind: Service
metadata: {namespace: aaa, name: ext, creationTimestamp: "2026-02-01T00:00:00Z"}
spec: {clusterIP: 198.19.0.12, externalIPs: [198.19.0.10], ports: [{name: http, port: 80, targetPort: 8080}]}
`

func TestRenderShowsContestedAddresses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "contested.yaml")
	if err := os.WriteFile(path, []byte(contestedYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	base := []string{"render", "-f", path, "--hostname-override", "node-a"}
	wantLines := []string{
		"aaa/cip:http/TCP claims 198.19.0.10:80/TCP as clusterIP, kept by shop/web:http/TCP as clusterIP: not programmed",
		"aaa/ext:http/TCP claims 198.19.0.10:80/TCP as externalIP, kept by shop/web:http/TCP as clusterIP",
		"aaa/np:http/TCP claims node port 30080/TCP as nodePort, kept by shop/web:http/TCP as nodePort: no node port",
	}
	out, _, err := execute(t, base...)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range wantLines {
		if !strings.Contains(out, "! contested: "+want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "aaa/cip:http/TCP  ") {
		t.Errorf("aaa/cip should not be listed as a programmed port:\n%s", out)
	}

	out, _, err = execute(t, append(base, "-o", "json")...)
	if err != nil {
		t.Fatal(err)
	}
	var snap view.Snapshot
	if err := json.Unmarshal([]byte(out), &snap); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if c := snap.Families[0].Contested; len(c) != 3 || c[0].ServicePort != "aaa/cip:http/TCP" || c[0].KeptBy != "shop/web:http/TCP" {
		t.Errorf("contested = %+v", c)
	}

	for _, mode := range []string{"nftables", "iptables"} {
		out, _, err = execute(t, append(base, "--proxy-mode", mode)...)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(out, "# contested: "); n != 3 {
			t.Errorf("%s: %d contested lines, want 3:\n%s", mode, n, out)
		}
		if strings.Contains(out, "# conflict") {
			t.Errorf("%s: the renderer saw conflicts the model should have resolved:\n%s", mode, out)
		}
	}
}
