// Package monitoring tests what kproxy ships for operators: the Grafana
// dashboard deploy/grafana/kproxy.json and the Prometheus alerting rules
// deploy/prometheus/kproxy-rules.yaml. Every PromQL expression in them is
// parsed with Prometheus's own parser, and every metric they name must be
// registered by kproxy and exported by a running kproxy in each proxy mode
// (metrics_test.go), so that renaming a metric breaks the build, not the
// dashboard.
//
// This is a separate Go module: the prometheus/prometheus module is large
// and stays out of kproxy's own go.mod (go.mod replaces kproxy with ../..).
//
// Addresses: the running kproxy reads the built-in example cluster
// (internal/example: 198.18.0.0/16 nodes and pods, 198.19.0.0/16 service
// IPs, fd00::/8 for IPv6) in a throwaway network namespace and serves its
// metrics on 127.0.0.1 there.
package monitoring

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

// The files under test, relative to this directory.
var (
	dashboardPath = filepath.Join("..", "..", "deploy", "grafana", "kproxy.json")
	rulesPath     = filepath.Join("..", "..", "deploy", "prometheus", "kproxy-rules.yaml")
)

// promql is the parser Prometheus uses by default (no experimental
// functions), so anything it accepts a stock Prometheus accepts too.
var promql = parser.NewParser(parser.Options{})

// expr is one PromQL expression and where it was found.
type expr struct {
	where string // "dashboard panel \"…\" target A", "rule KproxySyncStale"
	text  string // as written (with Grafana's variables)
	// selectorOnly is set for a Grafana variable's label_values() query,
	// whose first argument is a series selector, not an expression.
	selectorOnly bool
}

// grafanaIntervals are Grafana's built-in interval variables, which are
// replaced by a duration before parsing (as Grafana does before sending the
// query). Other variables ($instance, $node) may only appear inside label
// matcher values, where the parser sees them as text; anywhere else the
// parse fails, as it would in Prometheus for some value of them.
var grafanaIntervals = strings.NewReplacer(
	"${__rate_interval}", "5m", "$__rate_interval", "5m",
	"${__interval}", "1m", "$__interval", "1m",
	"${__range}", "6h", "$__range", "6h",
)

// dashboard is the part of Grafana's dashboard JSON model the test reads.
type dashboard struct {
	Title         string  `json:"title"`
	UID           string  `json:"uid"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource json.RawMessage `json:"datasource"`
	Targets    []struct {
		RefID      string          `json:"refId"`
		Expr       string          `json:"expr"`
		Datasource json.RawMessage `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's panels
}

type variable struct {
	Name  string          `json:"name"`
	Type  string          `json:"type"`
	Query json.RawMessage `json:"query"` // a string, or {"query": "…"} in newer schemas
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	return d
}

// allPanels flattens rows.
func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// variableQuery returns a query variable's query text.
func variableQuery(v variable) (string, error) {
	var s string
	if err := json.Unmarshal(v.Query, &s); err == nil {
		return s, nil
	}
	var o struct {
		Query string `json:"query"`
	}
	if err := json.Unmarshal(v.Query, &o); err != nil {
		return "", fmt.Errorf("variable %q: query is neither a string nor {\"query\": …}: %v", v.Name, err)
	}
	return o.Query, nil
}

// labelValuesRE matches Grafana's Prometheus variable query
// label_values(SELECTOR, LABEL).
var labelValuesRE = regexp.MustCompile(`^\s*label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$`)

// dashboardExprs returns every PromQL expression of the dashboard: each
// panel target's and each query variable's.
func dashboardExprs(t *testing.T, d dashboard) []expr {
	t.Helper()
	var out []expr
	for _, p := range allPanels(d.Panels) {
		for _, tg := range p.Targets {
			out = append(out, expr{where: fmt.Sprintf("dashboard panel %q target %s", p.Title, tg.RefID), text: tg.Expr})
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, err := variableQuery(v)
		if err != nil {
			t.Error(err)
			continue
		}
		m := labelValuesRE.FindStringSubmatch(q)
		if m == nil {
			t.Errorf("dashboard variable %q: query %q is not label_values(SELECTOR, LABEL)", v.Name, q)
			continue
		}
		out = append(out, expr{where: fmt.Sprintf("dashboard variable %q", v.Name), text: m[1], selectorOnly: true})
	}
	return out
}

func loadRules(t *testing.T) *rulefmt.RuleGroups {
	t.Helper()
	groups, errs := rulefmt.ParseFile(rulesPath, false, model.LegacyValidation, promql, slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("rulefmt: %v", err)
	}
	if groups == nil {
		t.FailNow()
	}
	return groups
}

func ruleExprs(g *rulefmt.RuleGroups) []expr {
	var out []expr
	for _, grp := range g.Groups {
		for _, r := range grp.Rules {
			name := r.Alert
			if name == "" {
				name = r.Record
			}
			out = append(out, expr{where: fmt.Sprintf("rule %s (group %s)", name, grp.Name), text: r.Expr})
		}
	}
	return out
}

// parsed is an expression's parse: the metric names it selects and its
// vector selectors' matchers.
type parsed struct {
	names     []string
	selectors [][]*labels.Matcher
}

// parse parses e with Prometheus's parser and returns the metric names it
// selects. A selector without a metric name is an error: the test could
// not check it against kproxy's metrics.
func parse(e expr) (parsed, error) {
	text := grafanaIntervals.Replace(e.text)
	var p parsed
	if e.selectorOnly {
		ms, err := promql.ParseMetricSelector(text)
		if err != nil {
			return p, err
		}
		p.selectors = append(p.selectors, ms)
	} else {
		node, err := promql.ParseExpr(text)
		if err != nil {
			return p, err
		}
		parser.Inspect(node, func(n parser.Node, _ []parser.Node) error {
			if vs, ok := n.(*parser.VectorSelector); ok {
				p.selectors = append(p.selectors, vs.LabelMatchers)
			}
			return nil
		})
	}
	for _, ms := range p.selectors {
		name := ""
		for _, m := range ms {
			if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
		if name == "" {
			return p, fmt.Errorf("a selector names no metric: %v", ms)
		}
		if !slices.Contains(p.names, name) {
			p.names = append(p.names, name)
		}
	}
	if len(p.names) == 0 {
		return p, fmt.Errorf("names no metric")
	}
	return p, nil
}

// namedMetrics parses every expression of the dashboard and the rules and
// returns each metric name with the places that use it.
func namedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	exprs := append(dashboardExprs(t, loadDashboard(t)), ruleExprs(loadRules(t))...)
	uses := map[string][]string{}
	for _, e := range exprs {
		p, err := parse(e)
		if err != nil {
			t.Errorf("%s: %v\n%s", e.where, err, e.text)
			continue
		}
		for _, n := range p.names {
			uses[n] = append(uses[n], e.where)
		}
	}
	return uses
}

// TestDashboard checks the dashboard's structure and parses every
// expression: a datasource variable that every panel and target uses,
// node and instance variables, and every series selector filtered by them
// (so that one node's panels never mix in another's).
func TestDashboard(t *testing.T) {
	d := loadDashboard(t)
	if d.Title == "" || d.UID == "" {
		t.Errorf("dashboard has no title or uid")
	}
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d: want a current schema (36 or later: datasource references by uid)", d.SchemaVersion)
	}
	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if v, ok := vars["datasource"]; !ok || v.Type != "datasource" {
		t.Errorf("no datasource variable of type datasource: %+v", v)
	} else if q, _ := variableQuery(v); q != "prometheus" {
		t.Errorf("datasource variable's query is %q, want prometheus", q)
	}
	for _, name := range []string{"node", "instance"} {
		if v, ok := vars[name]; !ok || v.Type != "query" {
			t.Errorf("no query variable %q", name)
		}
	}
	usesDatasource := func(raw json.RawMessage) bool {
		var ds struct {
			UID string `json:"uid"`
		}
		return json.Unmarshal(raw, &ds) == nil && ds.UID == "${datasource}"
	}
	ids := map[int]string{}
	titles := map[string]bool{}
	targets := 0
	for _, p := range allPanels(d.Panels) {
		if other, dup := ids[p.ID]; dup {
			t.Errorf("panels %q and %q share id %d", other, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		if titles[p.Title] {
			t.Errorf("two panels are titled %q (the test's messages name panels by title)", p.Title)
		}
		titles[p.Title] = true
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		if !usesDatasource(p.Datasource) {
			t.Errorf("panel %q does not use the ${datasource} variable: %s", p.Title, p.Datasource)
		}
		for _, tg := range p.Targets {
			targets++
			if !usesDatasource(tg.Datasource) {
				t.Errorf("panel %q target %s does not use the ${datasource} variable", p.Title, tg.RefID)
			}
		}
	}
	exprs := dashboardExprs(t, d)
	if len(exprs) != targets+2 {
		t.Errorf("found %d expressions for %d targets and 2 variables", len(exprs), targets)
	}
	for _, e := range exprs {
		p, err := parse(e)
		if err != nil {
			t.Errorf("%s: %v\n%s", e.where, err, e.text)
			continue
		}
		if e.selectorOnly {
			continue
		}
		for _, ms := range p.selectors {
			if !hasMatcher(ms, "instance", "$instance") || !hasMatcher(ms, "node", "$node") {
				t.Errorf("%s: selector %v is not filtered by instance=~\"$instance\" and node=~\"$node\"", e.where, ms)
			}
		}
	}
}

func hasMatcher(ms []*labels.Matcher, name, value string) bool {
	for _, m := range ms {
		if m.Name == name && m.Type == labels.MatchRegexp && m.Value == value {
			return true
		}
	}
	return false
}

// TestRules parses the alerting rules with rulefmt (which also parses each
// expression and checks the templates) and checks that each alert says
// how bad it is and what to do.
func TestRules(t *testing.T) {
	g := loadRules(t)
	n := 0
	for _, grp := range g.Groups {
		for _, r := range grp.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			switch r.Labels["severity"] {
			case "critical", "warning", "info":
			default:
				t.Errorf("alert %s: severity %q, want critical, warning or info", r.Alert, r.Labels["severity"])
			}
			for _, a := range []string{"summary", "description"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("alert %s has no %s", r.Alert, a)
				}
			}
		}
	}
	if n == 0 {
		t.Fatalf("%s has no alert", rulesPath)
	}
	for _, e := range ruleExprs(g) {
		if _, err := parse(e); err != nil {
			t.Errorf("%s: %v\n%s", e.where, err, e.text)
		}
	}
}

// TestParseRejects keeps the checks above honest: an expression Prometheus
// would refuse, and one naming no metric, are errors.
func TestParseRejects(t *testing.T) {
	for _, e := range []expr{
		{where: "bad syntax", text: `rate(kubeproxy_sync_proxy_rules_duration_seconds_count[$__rate_interval]`},
		{where: "variable outside a string", text: `rate(kubeproxy_sync_proxy_rules_duration_seconds_count[$window])`},
		{where: "no metric name", text: `sum({instance=~"$instance"})`},
		{where: "bad selector", text: `kproxy_info{node=~"$node"`, selectorOnly: true},
	} {
		if p, err := parse(e); err == nil {
			t.Errorf("%s: %q parsed (names %v), want an error", e.where, e.text, p.names)
		}
	}
	p, err := parse(expr{text: `histogram_quantile(0.99, sum by (le) (rate(a_bucket{x="1"}[$__rate_interval]) * on (instance) group_left (mode) b))`})
	if err != nil || !slices.Equal(p.names, []string{"a_bucket", "b"}) {
		t.Errorf("names %v, %v; want [a_bucket b]", p.names, err)
	}
}
