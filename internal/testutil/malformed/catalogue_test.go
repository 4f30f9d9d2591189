package malformed_test

// TestCatalogueModel gives every object-level case of the catalogue, all in
// one kubectl List beside nothing else, to the file source's parser and
// the model (as `kproxy --from-file` does, without a kernel), and checks
// each case's verdict: skipped whole or in part with its reason, contested,
// accepted, not proxied or ignored; and whether its cluster IP and its
// endpoint reach the state the renderers are given. Addresses: see the
// package comment.

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/source/file"
	"github.com/kproxy/kproxy/internal/testutil/fuzzsnap"
	"github.com/kproxy/kproxy/internal/testutil/malformed"
)

func TestCatalogueModel(t *testing.T) {
	fuzzsnap.Quiet()
	cases := malformed.Cases()
	if len(cases) < 100 {
		t.Errorf("%d cases, the catalogue must have at least 100", len(cases))
	}
	var items []any
	var owner []int // case of each item
	names := map[string]bool{}
	for i, c := range cases {
		if names[c.Name] {
			t.Errorf("case name %q used twice", c.Name)
		}
		names[c.Name] = true
		for _, o := range c.Objects {
			items = append(items, o)
			owner = append(owner, i)
		}
	}
	data, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	if err != nil {
		t.Fatal(err)
	}
	objs, errs := file.Parse("catalogue.json", data)
	docErrs := map[int][]*file.DocumentError{}
	for _, err := range errs {
		var de *file.DocumentError
		if !errors.As(err, &de) || de.Item < 0 {
			t.Fatalf("not an item's error: %v", err)
		}
		docErrs[owner[de.Item]] = append(docErrs[owner[de.Item]], de)
	}
	var reports []*model.InvalidError
	tr := model.NewTracker(model.TrackerOptions{Hostname: "node-a", Families: []v1.IPFamily{model.IPv4, model.IPv6},
		OnInvalid: func(e *model.InvalidError) { reports = append(reports, e) }})
	objs.Feed(tr)
	u := tr.Take()
	states := map[v1.IPFamily]*model.State{}
	var lost []model.LostClaim
	for _, f := range []v1.IPFamily{model.IPv4, model.IPv6} {
		states[f] = model.NewState(f)
		states[f].Apply(u.Families[f])
		lost = append(lost, states[f].NewlyLost()...)
	}
	inRules := func(ip string) (cluster, endpoint bool) {
		for _, st := range states {
			for n, sp := range st.Services {
				if sp.ClusterIP.String() == ip {
					cluster = true
				}
				for _, e := range model.SelectEndpoints(sp, st.Endpoints[n], "node-a", "").AllReachable {
					if e.IP.String() == ip {
						endpoint = true
					}
				}
			}
		}
		return cluster, endpoint
	}
	for i, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			var mine []*model.InvalidError
			for _, r := range reports {
				if r.Object == c.Object && (r.Kind == c.Kind || c.Kind == "") {
					mine = append(mine, r)
				}
			}
			var lostMine []string
			for _, l := range lost {
				if l.Loser.NamespacedName.String() == c.Object {
					lostMine = append(lostMine, l.String())
				}
			}
			describe := func() string {
				var s []string
				for _, r := range mine {
					s = append(s, r.Error()+" ["+r.Category+"]")
				}
				for _, d := range docErrs[i] {
					s = append(s, d.Error())
				}
				return strings.Join(append(s, lostMine...), "; ")
			}
			has := func(category string, whole bool) bool {
				return slices.ContainsFunc(mine, func(r *model.InvalidError) bool { return r.Category == category && (!whole || r.Whole) })
			}
			switch c.Want {
			case malformed.Skip:
				if c.Reason == malformed.ReasonUndecodable {
					if len(docErrs[i]) == 0 {
						t.Errorf("not refused by the file source: %s", describe())
					}
				} else if !has(c.Reason, true) {
					t.Errorf("not skipped whole as %s: %s", c.Reason, describe())
				}
			case malformed.SkipPart:
				if !has(c.Reason, false) {
					t.Errorf("no part skipped as %s: %s", c.Reason, describe())
				}
				if has(c.Reason, true) {
					t.Errorf("skipped whole: %s", describe())
				}
			case malformed.Contested:
				if len(lostMine) == 0 {
					t.Errorf("%s lost no claim: %s", c.Object, describe())
				}
			default:
				if len(mine) > 0 || len(docErrs[i]) > 0 || len(lostMine) > 0 {
					t.Errorf("want %s, got reports: %s", c.Want, describe())
				}
			}
			cl, _ := inRules(c.ClusterIP)
			if cl != c.InRules {
				t.Errorf("cluster IP %s in the state: %v, want %v", c.ClusterIP, cl, c.InRules)
			}
			_, ep := inRules(c.Endpoint)
			if ep != c.EndpointInRules {
				t.Errorf("endpoint %s in the state: %v, want %v", c.Endpoint, ep, c.EndpointInRules)
			}
		})
	}
}

// TestCatalogueFiles reads every file-level case as the file source does
// (one file of a directory) and checks its verdict.
func TestCatalogueFiles(t *testing.T) {
	fuzzsnap.Quiet()
	dir := t.TempDir()
	for _, c := range malformed.FileCases() {
		t.Run(c.Name, func(t *testing.T) {
			path := filepath.Join(dir, c.FileName)
			if err := os.WriteFile(path, c.Data(), 0o600); err != nil {
				t.Fatal(err)
			}
			defer os.Remove(path)
			start := time.Now()
			objs, errs := file.Load(path)
			// Generous: the machine is shared; alone it takes ~2 s.
			if d := time.Since(start); d > 2*time.Minute {
				t.Errorf("reading took %v", d)
			}
			var fault *file.FileError
			for _, err := range errs {
				if !errors.As(err, &fault) {
					fault = nil
				}
			}
			switch c.Want {
			case malformed.FileFault:
				if fault == nil || fault.Reason != c.Reason {
					t.Errorf("want a file fault %s, got %v", c.Reason, errs)
				}
			case malformed.Skip:
				var reports []*model.InvalidError
				tr := model.NewTracker(model.TrackerOptions{Hostname: "node-a", OnInvalid: func(e *model.InvalidError) { reports = append(reports, e) }})
				objs.Feed(tr)
				if len(errs) > 0 || !slices.ContainsFunc(reports, func(r *model.InvalidError) bool {
					return r.Object == c.Object && r.Category == c.Reason && r.Whole && len(r.Error()) < 4096
				}) {
					t.Errorf("want %s skipped as %s in a short report, got errors %v, reports %d", c.Object, c.Reason, errs, len(reports))
				}
			}
		})
	}
}
