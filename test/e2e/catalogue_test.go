package e2e

// The catalogue of malformed inputs (internal/testutil/malformed)
// through a real API server, the half the kernel test (file source) cannot
// do. Every case the catalogue says the API server refuses is created,
// object by object, as kubectl would create it, and one of its objects must
// be refused (400, 404, 409 or 422). Every case it accepts is created, all
// in one batch, while kproxy runs on node-a in each mode; then, as the
// kernel test checks: kproxy still runs, one log entry names each skipped
// or contested object and its reason, the metric counts them, the live
// rules hold a case's cluster IP and endpoint exactly when the case says
// so, and healthy services created after the batch carry TCP and UDP from
// the client and from a pod.
//
// Addresses: the cases' own (package malformed's doc: cluster IPs
// 198.19.60.0/23 and 198.19.62.0/24, inside the ClusterIP range; endpoints
// 198.18.140.0/22, where nothing listens; external IPs 198.19.220.0/24).
// The healthy services have fixed cluster IPs, 198.19.0.10 (TCP) and
// 198.19.0.18 (UDP), so the allocator never hands them a case's address.
// The rest: env_test.go.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/testutil/malformed"
	"github.com/kproxy/kproxy/test/e2e/framework"
)

var (
	catalogueWebIP = addr("198.19.0.10")
	catalogueDNSIP = addr("198.19.0.18")
)

// catalogueSettle bounds the wait, after the healthy services carry
// traffic, for the log and metrics to show every case.
const catalogueSettle = 30 * time.Second

// TestMalformedCatalogueAPI: the refusals first, then the accepted cases in
// every mode, all against one control plane.
func TestMalformedCatalogueAPI(t *testing.T) {
	start := time.Now()
	cp := sharedControlPlane(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: malformed.Namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating namespace %s: %v", malformed.Namespace, err)
	}
	cases := malformed.Cases()
	t.Run("refused", func(t *testing.T) {
		s := time.Now()
		testCatalogueRefused(t, cp, cases)
		t.Logf("refusals checked in %s", time.Since(s).Round(time.Millisecond))
	})
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			s := time.Now()
			testCatalogueAccepted(t, cp, mode, cases)
			t.Logf("accepted cases in %s mode: %s", mode.name, time.Since(s).Round(time.Millisecond))
		})
	}
	t.Logf("catalogue through the API server: %s", time.Since(start).Round(time.Millisecond))
}

// apiObjects creates catalogue objects through the API server, as the
// JSON the catalogue holds (so values no Go type could hold reach it too),
// and deletes what it created.
type apiObjects struct {
	t       *testing.T
	ctx     context.Context
	rc      rest.Interface
	created []string // the created objects' paths
}

func newAPIObjects(t *testing.T, ctx context.Context, cp *framework.ControlPlane) *apiObjects {
	a := &apiObjects{t: t, ctx: ctx, rc: cp.Client.Discovery().RESTClient()}
	t.Cleanup(a.deleteAll)
	return a
}

// collection is where kubectl would create item: the collection of its
// apiVersion and kind, in its namespace ("default" when it names none).
// An item that is not an object, or has no apiVersion or a kind the
// catalogue does not use, is posted to the Services of the catalogue's
// namespace (the API server then decodes it as a Service).
func collection(item any) string {
	o, _ := item.(map[string]any)
	apiVersion, _ := o["apiVersion"].(string)
	kind, _ := o["kind"].(string)
	resource := map[string]string{"Service": "services", "EndpointSlice": "endpointslices", "Node": "nodes", "Deployment": "deployments"}[kind]
	if o == nil || apiVersion == "" || resource == "" {
		return path.Join("/api/v1/namespaces", malformed.Namespace, "services")
	}
	prefix := "/apis/" + apiVersion
	if !strings.Contains(apiVersion, "/") {
		prefix = "/api/" + apiVersion
	}
	if kind == "Node" {
		return path.Join(prefix, resource)
	}
	ns := "default"
	if m, ok := o["metadata"].(map[string]any); ok {
		if s, ok := m["namespace"].(string); ok && s != "" {
			ns = s
		}
	}
	return path.Join(prefix, "namespaces", ns, resource)
}

// create creates one item and, for a Service with a status (which create
// ignores), writes that status as a load balancer controller would.
func (a *apiObjects) create(item any) error {
	body, err := json.Marshal(item)
	if err != nil {
		return err
	}
	coll := collection(item)
	raw, err := a.rc.Post().AbsPath(coll).SetHeader("Content-Type", "application/json").Body(body).Do(a.ctx).Raw()
	if err != nil {
		return withStatus(raw, err)
	}
	var got map[string]any
	if err := json.Unmarshal(raw, &got); err != nil {
		return fmt.Errorf("the API server's answer: %w", err)
	}
	name, _ := got["metadata"].(map[string]any)["name"].(string)
	a.created = append(a.created, path.Join(coll, name))
	o, _ := item.(map[string]any)
	if status, ok := o["status"]; ok && o["kind"] == "Service" {
		got["status"] = status
		body, err := json.Marshal(got)
		if err != nil {
			return err
		}
		raw, err := a.rc.Put().AbsPath(path.Join(coll, name, "status")).SetHeader("Content-Type", "application/json").
			Body(body).Do(a.ctx).Raw()
		if err != nil {
			return withStatus(raw, err)
		}
	}
	return nil
}

// withStatus is err with the Status the API server answered, when body
// is one: this client has no decoder for it, and its own error says only
// "the server rejected our request for an unknown reason".
func withStatus(body []byte, err error) error {
	var st metav1.Status
	if json.Unmarshal(body, &st) == nil && st.Kind == "Status" && st.Code != 0 {
		return &apierrors.StatusError{ErrStatus: st}
	}
	return err
}

// deleteAll deletes what create created, newest first.
func (a *apiObjects) deleteAll() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	for _, p := range slices.Backward(a.created) {
		if err := a.rc.Delete().AbsPath(p).Do(ctx).Error(); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	a.created = nil
	if err := errors.Join(errs...); err != nil {
		a.t.Errorf("cleanup: deleting the catalogue's objects: %v", err)
	}
}

// refusal says whether err is the API server refusing item (bad request,
// no such API, already there, invalid; or a server error, when the object
// was not stored), and how.
func (a *apiObjects) refusal(item any, err error) (string, bool) {
	var se apierrors.APIStatus
	if !errors.As(err, &se) {
		return "", false
	}
	st := se.Status()
	how := fmt.Sprintf("%d %s: %s", st.Code, st.Reason, st.Message)
	switch st.Code {
	case http.StatusNotFound:
		if d := st.Details; d != nil && d.Kind == "namespaces" {
			// The object's namespace does not exist: a refusal only if
			// it cannot exist.
			_, err := a.rc.Post().AbsPath("/api/v1/namespaces").SetHeader("Content-Type", "application/json").
				Body(mustJSON(corev1.Namespace{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
					ObjectMeta: metav1.ObjectMeta{Name: d.Name}})).Do(a.ctx).Raw()
			if err == nil {
				a.created = append(a.created, path.Join("/api/v1/namespaces", d.Name))
			}
			if !apierrors.IsInvalid(err) {
				return fmt.Sprintf("%s, but creating namespace %q: %v", how, d.Name, err), false
			}
			return how + " (and the namespace itself is invalid)", true
		}
		return how, true
	case http.StatusBadRequest, http.StatusConflict, http.StatusUnprocessableEntity:
		return how, true
	case http.StatusInternalServerError:
		o, _ := item.(map[string]any)
		m, _ := o["metadata"].(map[string]any)
		name, _ := m["name"].(string)
		if name == "" {
			return "", false
		}
		if err := a.rc.Get().AbsPath(path.Join(collection(item), name)).Do(a.ctx).Error(); apierrors.IsNotFound(err) {
			return how + " (not stored)", true
		}
	}
	return "", false
}

// testCatalogueRefused creates each case the API server must refuse, its
// objects in order, until one is refused.
func testCatalogueRefused(t *testing.T, cp *framework.ControlPlane, cases []malformed.Case) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	a := newAPIObjects(t, ctx, cp)
	byHow := map[string]int{}
	for _, c := range cases {
		if c.APIAccepts {
			continue
		}
		t.Run(c.Name, func(t *testing.T) {
			for i, item := range c.Objects {
				err := a.create(item)
				if err == nil {
					continue
				}
				how, ok := a.refusal(item, err)
				if !ok {
					t.Fatalf("object %d of %d: neither accepted nor refused: %v %s", i+1, len(c.Objects), err, how)
				}
				code, _, _ := strings.Cut(how, ":")
				byHow[code]++
				t.Logf("object %d of %d refused: %.400s", i+1, len(c.Objects), how)
				return
			}
			t.Errorf("the API server accepts every object of the case (the catalogue says it refuses one)")
		})
	}
	t.Logf("refusals by status: %v", byHow)
}

// testCatalogueAccepted runs kproxy in mode and creates every case the
// API server accepts, then the healthy services, and checks each case.
func testCatalogueAccepted(t *testing.T, cp *framework.ControlPlane, mode modeCase, cases []malformed.Case) {
	e := newEnv(t, cp, mode)
	a := newAPIObjects(t, e.ctx, cp)
	var accepted []malformed.Case
	for _, c := range cases {
		if !c.APIAccepts {
			continue
		}
		c = c.ThroughAPI()
		accepted = append(accepted, c)
		for i, item := range c.Objects {
			if err := a.create(item); err != nil {
				t.Errorf("case %q: the API server refuses object %d of %d (the catalogue says it accepts them): %v", c.Name, i+1, len(c.Objects), err)
			}
		}
	}
	// The healthy services come last. Each informer delivers its kind in
	// the order the API server stored them, so once their traffic flows
	// kproxy has synced with every case in its state.
	e.createService("web", func(s *corev1.Service) {
		s.Spec.ClusterIP, s.Spec.ClusterIPs = catalogueWebIP.String(), []string{catalogueWebIP.String()}
	})
	e.createService("dns", func(s *corev1.Service) {
		s.Spec.ClusterIP, s.Spec.ClusterIPs = catalogueDNSIP.String(), []string{catalogueDNSIP.String()}
		s.Spec.Ports = []corev1.ServicePort{portUDP}
	})
	e.setEndpoints("web", ipv4, endpoint{pod: podA1}, endpoint{pod: podB1})
	e.setEndpoints("dns", ipv4, endpoint{pod: podA2}, endpoint{pod: podB1})
	e.expectServers(client, "tcp", ap(catalogueWebIP, 80), podA1, podB1)
	e.expectServers(testerA, "tcp", ap(catalogueWebIP, 80), podA1, podB1)
	e.expectServers(client, "udp", ap(catalogueDNSIP, 53), podA2, podB1)
	e.expectServers(testerA, "udp", ap(catalogueDNSIP, 53), podA2, podB1)

	// How many accepted cases each series must at least count.
	want := map[string]int{}
	for _, c := range accepted {
		if malformed.Reported(c) {
			want[fmt.Sprintf(`kproxy_invalid_objects_total{kind=%q,reason=%q}`, c.Kind, c.Reason)]++
		}
	}
	var problems map[string][]string
	check := func() error {
		metrics, err := e.metrics()
		if err != nil {
			return err
		}
		dump, err := rulesDump(mode, e.node.Name)
		if err != nil {
			return err
		}
		entries := malformed.LogEntries(e.kproxyLog())
		problems = map[string][]string{}
		for _, c := range accepted {
			var p []string
			if parts := malformed.SkipLog(c); parts != nil {
				if !malformed.AnyEntry(entries, parts...) {
					p = append(p, fmt.Sprintf("no log entry with %q", parts))
				}
			} else if c.Object != "" && malformed.AnyEntry(entries, `"Skipping invalid `, malformed.KlogKV("object", c.Object)) {
				p = append(p, fmt.Sprintf("a valid object (%s) is reported as skipped", c.Want))
			}
			if malformed.Reported(c) {
				series := fmt.Sprintf(`kproxy_invalid_objects_total{kind=%q,reason=%q}`, c.Kind, c.Reason)
				if v, _ := metricValue(metrics, series); v < float64(want[series]) {
					p = append(p, fmt.Sprintf("%s = %v, want at least %d (the accepted cases it counts)", series, v, want[series]))
				}
			}
			if got := malformed.HasAddr(dump, c.ClusterIP); got != c.InRules {
				p = append(p, fmt.Sprintf("cluster IP %s in the rules: %v, want %v", c.ClusterIP, got, c.InRules))
			}
			if got := malformed.HasAddr(dump, c.Endpoint); got != c.EndpointInRules {
				p = append(p, fmt.Sprintf("endpoint %s in the rules: %v, want %v", c.Endpoint, got, c.EndpointInRules))
			}
			if p != nil {
				problems[c.Name] = p
			}
		}
		if len(problems) > 0 {
			return fmt.Errorf("%d of %d cases not as they must be", len(problems), len(accepted))
		}
		return nil
	}
	deadline := time.Now().Add(catalogueSettle)
	for err := check(); err != nil && time.Now().Before(deadline); err = check() {
		e.alive()
		time.Sleep(500 * time.Millisecond)
	}
	e.alive()
	for _, c := range accepted {
		t.Run(c.Name, func(t *testing.T) {
			for _, p := range problems[c.Name] {
				t.Error(p)
			}
		})
	}
	// The batch did not disturb the healthy services.
	e.expectServers(client, "tcp", ap(catalogueWebIP, 80), podA1, podB1)
	e.expectServers(testerA, "udp", ap(catalogueDNSIP, 53), podA2, podB1)
	e.alive()
	t.Logf("%d accepted cases checked in %s mode", len(accepted), mode.name)
}

// rulesDump is the node's whole ruleset as the mode's tools print it.
func rulesDump(mode modeCase, ns string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	switch mode.proxyMode {
	case "nftables":
		return framework.RunIn(ctx, ns, "nft", "list", "ruleset")
	case "iptables":
		var b xtables.Backend
		for _, kv := range mode.env {
			if v, ok := strings.CutPrefix(kv, xtables.EnvMode+"="); ok {
				b = xtables.Backend(v)
			}
		}
		if b == "" {
			return "", fmt.Errorf("mode %s: no %s in its environment", mode.name, xtables.EnvMode)
		}
		var out strings.Builder
		for _, fam := range nftFamilies {
			s, err := framework.RunIn(ctx, ns, saveBin(b, fam))
			if err != nil {
				return "", err
			}
			out.WriteString(s)
		}
		return out.String(), nil
	}
	return "", fmt.Errorf("mode %s: no rules dump", mode.name)
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
