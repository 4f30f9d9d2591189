package kernel

// The catalogue of malformed inputs (internal/testutil/malformed)
// through the file source: kproxy on node-a reads its snapshot directory,
// where the example's healthy snapshot sits beside catalogue.json (every
// object-level case, in one kubectl List) and one file per file-level
// case; the two 50 MB files are added once kproxy runs. Per case: kproxy
// keeps running, one log entry names the object (or the file) and the
// reason, the metric counts it, the rules hold the case's cluster IP and
// endpoint exactly when the case says they must (so nothing is written
// from a skipped object), and the healthy services carry real traffic.
// Addresses: the example's plan (cluster_test.go) plus those of the
// catalogue: 198.19.60.0/22 the cases' cluster IPs, 198.18.140.0/22 their
// endpoints (nothing listens there).

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"os"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/testutil/malformed"
	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// TestMalformedCatalogue runs in nftables mode and iptables mode with each
// backend.
func TestMalformedCatalogue(t *testing.T) {
	for _, m := range []proxyMode{nftablesMode, iptablesMode(xtables.Legacy), iptablesMode(xtables.NFT)} {
		t.Run(m.name, func(t *testing.T) {
			for _, bin := range m.needs {
				netns.Require(t, bin)
			}
			testMalformedCatalogue(t, m)
		})
	}
}

func testMalformedCatalogue(t *testing.T, m proxyMode) {
	cases := malformed.Cases()
	var items []any
	firstItem := make([]int, len(cases))
	for i, c := range cases {
		firstItem[i] = len(items)
		items = append(items, c.Objects...)
	}
	catalogue, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{"catalogue.json": catalogue}
	var big []malformed.FileCase
	for _, fc := range malformed.FileCases() {
		if strings.HasPrefix(fc.FileName, "zz-50mb") {
			big = append(big, fc)
			continue
		}
		files[fc.FileName] = fc.Data()
	}
	c := newCluster(t, clusterOptions{mode: m, kproxyOn: []string{nodeA}, fromDir: true, files: files})
	dir := filepath.Dir(c.snapPath)
	// The 50 MB files, once kproxy runs: reading them takes seconds.
	for _, fc := range big {
		if err := os.WriteFile(filepath.Join(dir, fc.FileName), fc.Data(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	node := c.Nodes[nodeA]
	var body string
	netns.Eventually(t, 3*time.Minute, "the 50 MB files read", func() (bool, string) {
		code, b, err := node.HTTPGet("http://127.0.0.1:10249/metrics", 5*time.Second)
		if err != nil || code != 200 {
			return false, "metrics unreachable"
		}
		body = b
		return metricPositive(body, `kproxy_invalid_objects_total{kind="Service",reason="invalid_label"}`) &&
			metricPositive(body, `kproxy_source_file_errors_total{reason="unparsable"}`) &&
			strings.Contains(c.kproxy[nodeA].Log(), "zz-50mb-junk.yaml"), "not yet"
	})
	runProbes(t, c, []probe{
		{from: testerA, network: "tcp", dst: "198.19.0.10:80", servers: web, every: true, peer: peerOwn},
		{from: client, network: "tcp", dst: "198.19.0.10:80", servers: web, every: true, peer: peerMasq, masqBy: nodeA},
		{from: testerA, network: "udp", dst: "198.19.0.18:53", servers: dns, every: true, peer: peerOwn},
		{from: client, network: "tcp", dst: "[fd00:19::17]:80", servers: dual, every: true, peer: peerMasq, masqBy: nodeA},
	})
	if done, err := c.kproxy[nodeA].Exited(); done {
		t.Fatalf("kproxy exited: %v", err)
	}
	dump, err := c.mode.dump(node.NS)
	if err != nil {
		t.Fatal(err)
	}
	log := c.kproxy[nodeA].Log()
	entries := malformed.LogEntries(log)
	for _, e := range entries {
		if len(e) > 64<<10 {
			t.Errorf("a log entry of %d bytes: %.300s", len(e), e)
		}
	}
	catPath := filepath.Join(dir, "catalogue.json")
	for i, cs := range cases {
		t.Run(cs.Name, func(t *testing.T) {
			parts := malformed.SkipLog(cs)
			if cs.Reason == malformed.ReasonUndecodable {
				parts = []string{`"Skipping object"`, malformed.KlogKV("file", catPath)}
				if cs.Object != "" {
					ns, name, _ := strings.Cut(cs.Object, "/")
					if cs.Kind == "Node" {
						ns, name = "", cs.Object
					}
					parts = append(parts, malformed.KlogKV("name", name), malformed.KlogKV("namespace", ns))
				} else {
					parts = append(parts, "item="+strconv.Itoa(firstItem[i])+" ")
				}
			}
			if parts != nil {
				if !malformed.AnyEntry(entries, parts...) {
					t.Errorf("no log entry with %q", parts)
				}
				series := fmt.Sprintf(`kproxy_invalid_objects_total{kind=%q,reason=%q}`, cs.Kind, cs.Reason)
				if !metricPositive(body, series) {
					t.Errorf("%s not counted", series)
				}
			} else if cs.Object != "" && (malformed.AnyEntry(entries, `"Skipping invalid `, malformed.KlogKV("object", cs.Object)) ||
				malformed.AnyEntry(entries, `"Skipping object"`, malformed.KlogKV("file", catPath), "item="+strconv.Itoa(firstItem[i])+" ")) {
				t.Errorf("a valid object (%s) is reported as skipped", cs.Want)
			}
			if got := malformed.HasAddr(dump, cs.ClusterIP); got != cs.InRules {
				t.Errorf("cluster IP %s in the rules: %v, want %v", cs.ClusterIP, got, cs.InRules)
			}
			if got := malformed.HasAddr(dump, cs.Endpoint); got != cs.EndpointInRules {
				t.Errorf("endpoint %s in the rules: %v, want %v", cs.Endpoint, got, cs.EndpointInRules)
			}
		})
	}
	for _, fc := range malformed.FileCases() {
		t.Run("file: "+fc.Name, func(t *testing.T) {
			path := filepath.Join(dir, fc.FileName)
			switch fc.Want {
			case malformed.FileFault:
				parts := []string{`"Snapshot file cannot be used`, malformed.KlogKV("file", path), malformed.KlogKV("reason", fc.Reason)}
				if !malformed.AnyEntry(entries, parts...) {
					t.Errorf("no log entry with %q", parts)
				}
				if series := fmt.Sprintf(`kproxy_source_file_errors_total{reason=%q}`, fc.Reason); !metricPositive(body, series) {
					t.Errorf("%s not counted", series)
				}
			case malformed.Skip:
				parts := []string{`"Skipping invalid object"`, malformed.KlogKV("kind", fc.Kind), malformed.KlogKV("object", fc.Object), malformed.KlogKV("category", fc.Reason)}
				if !malformed.AnyEntry(entries, parts...) {
					t.Errorf("no log entry with %q", parts)
				}
			}
			if fc.ClusterIP != "" && malformed.HasAddr(dump, fc.ClusterIP) {
				t.Errorf("cluster IP %s in the rules", fc.ClusterIP)
			}
		})
	}
}
