package server

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
)

var (
	svcA = types.NamespacedName{Namespace: "ns1", Name: "svc-a"}
	svcB = types.NamespacedName{Namespace: "ns2", Name: "svc-b"}

	lo1 = netip.MustParseAddr("127.0.0.1")
	lo2 = netip.MustParseAddr("127.0.0.2")
)

func TestServiceHealthResponses(t *testing.T) {
	for _, tc := range []struct {
		name         string
		endpoints    map[types.NamespacedName]int
		proxyHealthy bool
		wantCode     int
		wantBody     string
		wantWeight   string
	}{{
		name:         "local endpoints and healthy proxy",
		endpoints:    map[types.NamespacedName]int{svcA: 2},
		proxyHealthy: true,
		wantCode:     200,
		wantWeight:   "2",
		wantBody:     "{\n\t\"service\": {\n\t\t\"namespace\": \"ns1\",\n\t\t\"name\": \"svc-a\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}",
	}, {
		name:         "no local endpoints",
		endpoints:    map[types.NamespacedName]int{svcA: 0},
		proxyHealthy: true,
		wantCode:     503,
		wantWeight:   "0",
		wantBody:     "{\n\t\"service\": {\n\t\t\"namespace\": \"ns1\",\n\t\t\"name\": \"svc-a\"\n\t},\n\t\"localEndpoints\": 0,\n\t\"serviceProxyHealthy\": true\n}",
	}, {
		name:         "service missing from the endpoint map has none",
		endpoints:    map[types.NamespacedName]int{svcB: 5},
		proxyHealthy: true,
		wantCode:     503,
		wantWeight:   "0",
		wantBody:     "{\n\t\"service\": {\n\t\t\"namespace\": \"ns1\",\n\t\t\"name\": \"svc-a\"\n\t},\n\t\"localEndpoints\": 0,\n\t\"serviceProxyHealthy\": true\n}",
	}, {
		name:         "endpoints but unhealthy proxy",
		endpoints:    map[types.NamespacedName]int{svcA: 3},
		proxyHealthy: false,
		wantCode:     503,
		wantWeight:   "3",
		wantBody:     "{\n\t\"service\": {\n\t\t\"namespace\": \"ns1\",\n\t\t\"name\": \"svc-a\"\n\t},\n\t\"localEndpoints\": 3,\n\t\"serviceProxyHealthy\": false\n}",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(t0)
			h := NewProxyHealth(healthTimeout, clk)
			h.Updated(v1.IPv4Protocol)
			if !tc.proxyHealthy {
				h.QueuedUpdate(v1.IPv4Protocol)
				clk.Step(healthTimeout)
			}
			tn := newTestNet()
			s := NewServiceHealthServer("node-a", []netip.Addr{lo1}, h, tn.listen)
			t.Cleanup(s.Close)
			if err := s.SyncServices(map[types.NamespacedName]uint16{svcA: 30000}); err != nil {
				t.Fatal(err)
			}
			if err := s.SyncEndpoints(tc.endpoints); err != nil {
				t.Fatal(err)
			}
			// Load balancers probe any path.
			resp := get(t, httpURL(tn.actual(t, "127.0.0.1:30000"), "/healthz"))
			if resp.code != tc.wantCode {
				t.Errorf("code %d, want %d", resp.code, tc.wantCode)
			}
			if diff := cmp.Diff(tc.wantBody, resp.body); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
			for k, want := range map[string]string{
				"Content-Type":                     "application/json",
				"X-Content-Type-Options":           "nosniff",
				"X-Load-Balancing-Endpoint-Weight": tc.wantWeight,
			} {
				if got := resp.header.Get(k); got != want {
					t.Errorf("header %s = %q, want %q", k, got, want)
				}
			}
		})
	}
}

// refused reports whether nothing accepts connections on addr any more.
func refused(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, waitTimeout)
	if err == nil {
		c.Close()
		return false
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

func TestServiceHealthLifecycle(t *testing.T) {
	tn := newTestNet()
	s := NewServiceHealthServer("node-a", []netip.Addr{lo1, lo2}, nil, tn.listen)
	t.Cleanup(s.Close)

	// Two services, each on both node IPs.
	if err := s.SyncServices(map[types.NamespacedName]uint16{svcA: 30001, svcB: 30002}); err != nil {
		t.Fatal(err)
	}
	if err := s.SyncEndpoints(map[types.NamespacedName]int{svcA: 1, svcB: 2}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ addr, svc, weight string }{
		{"127.0.0.1:30001", "svc-a", "1"},
		{"127.0.0.2:30001", "svc-a", "1"},
		{"127.0.0.1:30002", "svc-b", "2"},
		{"127.0.0.2:30002", "svc-b", "2"},
	} {
		resp := get(t, httpURL(tn.actual(t, tc.addr), "/"))
		if resp.code != 200 || !strings.Contains(resp.body, `"name": "`+tc.svc+`"`) || resp.header.Get("X-Load-Balancing-Endpoint-Weight") != tc.weight {
			t.Errorf("%s: got %d %q weight %q, want 200 for %s weight %s", tc.addr, resp.code, resp.body, resp.header.Get("X-Load-Balancing-Endpoint-Weight"), tc.svc, tc.weight)
		}
	}
	oldA := tn.actual(t, "127.0.0.1:30001")
	oldB := tn.actual(t, "127.0.0.1:30002")

	// svcA moves to another port, svcB is removed.
	if err := s.SyncServices(map[types.NamespacedName]uint16{svcA: 30003}); err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{oldA, oldB} {
		if !refused(addr) {
			t.Errorf("%s still accepts connections after its health check was closed", addr)
		}
	}
	// A reopened health check starts without endpoints until the next
	// SyncEndpoints.
	resp := get(t, httpURL(tn.actual(t, "127.0.0.2:30003"), "/"))
	if resp.code != 503 || !strings.Contains(resp.body, `"localEndpoints": 0`) {
		t.Errorf("moved svc-a: %d %q, want 503 with 0 endpoints", resp.code, resp.body)
	}

	// An unchanged service keeps its listener (and its endpoint count).
	if err := s.SyncEndpoints(map[types.NamespacedName]int{svcA: 4}); err != nil {
		t.Fatal(err)
	}
	before := tn.actual(t, "127.0.0.1:30003")
	if err := s.SyncServices(map[types.NamespacedName]uint16{svcA: 30003}); err != nil {
		t.Fatal(err)
	}
	if n := tn.attemptsFor("127.0.0.1:30003"); n != 1 {
		t.Errorf("unchanged service was reopened (%d binds)", n)
	}
	if resp := get(t, httpURL(before, "/")); resp.code != 200 || resp.header.Get("X-Load-Balancing-Endpoint-Weight") != "4" {
		t.Errorf("unchanged svc-a: %d weight %q, want 200 weight 4", resp.code, resp.header.Get("X-Load-Balancing-Endpoint-Weight"))
	}

	s.Close()
	if !refused(before) {
		t.Error("health check still open after Close")
	}
}

func TestServiceHealthListenFailure(t *testing.T) {
	tn := newTestNet()
	tn.setFail("127.0.0.2:30001", errTestListen)
	s := NewServiceHealthServer("node-a", []netip.Addr{lo1, lo2}, nil, tn.listen)
	t.Cleanup(s.Close)

	err := s.SyncServices(map[types.NamespacedName]uint16{svcA: 30001, svcB: 30002})
	if !errors.Is(err, errTestListen) {
		t.Fatalf("SyncServices = %v, want it to wrap %v", err, errTestListen)
	}
	if !strings.Contains(err.Error(), `node node-a failed to start healthcheck "ns1/svc-a" on port 30001`) {
		t.Errorf("error %q does not name the node, service and port", err)
	}
	// The address that did bind was released again, so the port is free.
	if !tn.isClosed(t, "127.0.0.1:30001") {
		t.Error("half-opened health check left a listener open")
	}
	// The other service is unaffected.
	if resp := get(t, httpURL(tn.actual(t, "127.0.0.1:30002"), "/")); resp.code != 503 {
		t.Errorf("svc-b: %d, want 503 (no endpoints)", resp.code)
	}

	// The next sync tries again.
	tn.setFail("127.0.0.2:30001", nil)
	if err := s.SyncServices(map[types.NamespacedName]uint16{svcA: 30001, svcB: 30002}); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if err := s.SyncEndpoints(map[types.NamespacedName]int{svcA: 1}); err != nil {
		t.Fatal(err)
	}
	if resp := get(t, httpURL(tn.actual(t, "127.0.0.2:30001"), "/")); resp.code != 200 {
		t.Errorf("svc-a after retry: %d, want 200", resp.code)
	}
	if n := tn.attemptsFor("127.0.0.1:30002"); n != 1 {
		t.Errorf("svc-b rebound %d times, want once", n)
	}
}

func TestServiceHealthAllAddresses(t *testing.T) {
	tn := newTestNet()
	s := NewServiceHealthServer("node-a", nil, nil, tn.listen)
	t.Cleanup(s.Close)
	if err := s.SyncServices(map[types.NamespacedName]uint16{svcA: 30005}); err != nil {
		t.Fatal(err)
	}
	// No node IPs: one listener on the unspecified address.
	if n := tn.attemptsFor(":30005"); n != 1 {
		t.Errorf("binds on :30005 = %d, want 1", n)
	}
	if resp := get(t, httpURL(tn.actual(t, ":30005"), "/")); resp.code != 503 {
		t.Errorf("code %d, want 503", resp.code)
	}
}

// TestServiceHealthAddresses: the health check node ports listen on the
// addresses SetAddresses gives (upstream: the node's IPs inside
// nodePortAddresses), follow them when they change, and listen nowhere when
// no address matches.
func TestServiceHealthAddresses(t *testing.T) {
	tn := newTestNet()
	s := NewServiceHealthServer("node-a", nil, nil, tn.listen)
	t.Cleanup(s.Close)
	addrs := []netip.Addr{lo1}
	s.SetAddresses(func() []netip.Addr { return addrs })
	svcs := map[types.NamespacedName]uint16{svcA: 30006}
	if err := s.SyncServices(svcs); err != nil {
		t.Fatal(err)
	}
	if n := tn.attemptsFor("127.0.0.1:30006"); n != 1 {
		t.Fatalf("binds on 127.0.0.1:30006 = %d, want 1", n)
	}
	if n := tn.attemptsFor(":30006"); n != 0 {
		t.Fatalf("binds on :30006 = %d, want none (not every address is a node port address)", n)
	}
	first := tn.actual(t, "127.0.0.1:30006")

	// Unchanged addresses: the listener stays.
	if err := s.SyncServices(svcs); err != nil {
		t.Fatal(err)
	}
	if n := tn.attemptsFor("127.0.0.1:30006"); n != 1 {
		t.Errorf("rebinds with unchanged addresses: %d binds, want 1", n)
	}

	// The node's address changed: the health check moves.
	addrs = []netip.Addr{lo2}
	if err := s.SyncServices(svcs); err != nil {
		t.Fatal(err)
	}
	if n := tn.attemptsFor("127.0.0.2:30006"); n != 1 {
		t.Errorf("binds on 127.0.0.2:30006 = %d, want 1", n)
	}
	if !refused(first) {
		t.Errorf("the old address %s still accepts connections", first)
	}
	if resp := get(t, httpURL(tn.actual(t, "127.0.0.2:30006"), "/")); resp.code != 503 {
		t.Errorf("code %d, want 503 (no endpoints)", resp.code)
	}

	// Every IPv4 address only: tcp4 on 0.0.0.0, not a dual-stack socket.
	addrs = []netip.Addr{netip.IPv4Unspecified(), lo1}
	if err := s.SyncServices(svcs); err != nil {
		t.Fatal(err)
	}
	if n := tn.attemptsFor("0.0.0.0:30006"); n != 1 {
		t.Errorf("binds on 0.0.0.0:30006 = %d, want 1", n)
	}
	if n := tn.attemptsFor("127.0.0.1:30006"); n != 1 {
		t.Errorf("127.0.0.1 bound again beside 0.0.0.0 (%d binds in all), want it covered", n)
	}

	// No address matches: the service is tracked but nothing listens.
	addrs = nil
	if err := s.SyncServices(svcs); err != nil {
		t.Fatal(err)
	}
	if got := tn.actual(t, "0.0.0.0:30006"); !refused(got) {
		t.Errorf("%s still accepts connections with no node port address", got)
	}
}
