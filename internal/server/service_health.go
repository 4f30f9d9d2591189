package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// ServiceHealthServer serves the health check node ports of Services with
// externalTrafficPolicy: Local. Cloud load balancers probe them to learn
// which nodes have local endpoints: a node answers 200 only when it has at
// least one local endpoint for the service and the proxy is healthy, else
// 503, so the load balancer stops sending traffic that would be dropped.
type ServiceHealthServer struct {
	hostname string
	// addrs returns the addresses to listen on (see SetAddresses).
	addrs  func() []netip.Addr
	health *ProxyHealth
	listen ListenFunc

	mu       sync.RWMutex
	services map[types.NamespacedName]*hcInstance
}

// hcInstance is one service's health check: one HTTP server per node IP.
type hcInstance struct {
	port uint16
	// addrs are the addresses it was opened on (as addrs returned them).
	addrs     []netip.Addr
	servers   []*http.Server
	listeners []net.Listener
	endpoints int // local endpoints
}

// NewServiceHealthServer returns a ServiceHealthServer. hostname names the
// node in errors. nodeIPs are the addresses to listen on (upstream listens
// on the nodePortAddresses the node has; see SetAddresses); empty means all
// addresses. A nil health counts as always healthy. A nil listen means
// DefaultListen.
func NewServiceHealthServer(hostname string, nodeIPs []netip.Addr, health *ProxyHealth, listen ListenFunc) *ServiceHealthServer {
	if listen == nil {
		listen = DefaultListen
	}
	static := append([]netip.Addr(nil), nodeIPs...)
	if len(static) == 0 {
		static = []netip.Addr{netip.IPv4Unspecified(), netip.IPv6Unspecified()}
	}
	return &ServiceHealthServer{
		hostname: hostname,
		addrs:    func() []netip.Addr { return static },
		health:   health,
		listen:   listen,
		services: map[types.NamespacedName]*hcInstance{},
	}
}

// SetAddresses makes fn the source of the addresses to listen on, asked at
// every SyncServices: the node's addresses inside nodePortAddresses, as
// upstream's health check servers listen (GetNodeIPs). An unspecified
// address (0.0.0.0, ::) stands for every address of its family; both mean
// one dual-stack listener; an empty list means no listener at all (no
// local address matches). A health check already open on other addresses
// is moved to the new ones (the node's IP changed). Call it before the
// first SyncServices.
func (s *ServiceHealthServer) SetAddresses(fn func() []netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addrs = fn
}

// listenAddrs turns the addresses into (network, address) pairs for port.
func listenAddrs(ips []netip.Addr, port uint16) [][2]string {
	p := strconv.Itoa(int(port))
	all4 := slices.ContainsFunc(ips, func(a netip.Addr) bool { return a.Is4() && a.IsUnspecified() })
	all6 := slices.ContainsFunc(ips, func(a netip.Addr) bool { return a.Is6() && a.IsUnspecified() })
	if all4 && all6 {
		return [][2]string{{"tcp", net.JoinHostPort("", p)}}
	}
	var out [][2]string
	for _, ip := range ips {
		switch {
		case ip.IsUnspecified() && ip.Is4():
			out = append(out, [2]string{"tcp4", net.JoinHostPort("0.0.0.0", p)})
		case ip.IsUnspecified():
			// tcp6 on :: sets IPV6_V6ONLY: IPv6 addresses only.
			out = append(out, [2]string{"tcp6", net.JoinHostPort("::", p)})
		case all4 && ip.Is4(), all6 && ip.Is6():
			// Covered by the family's unspecified address.
		default:
			out = append(out, [2]string{"tcp", netip.AddrPortFrom(ip, port).String()})
		}
	}
	return out
}

// SyncServices makes newServices (service → health check node port) the set
// being served: services no longer present, or whose port changed, are
// closed; new ones are opened; unchanged ones keep their listeners and
// endpoint counts. A service whose port cannot be opened is skipped and
// reported in the returned error; the next SyncServices tries it again.
func (s *ServiceHealthServer) SyncServices(newServices map[types.NamespacedName]uint16) error {
	s.mu.Lock()
	defer s.mu.Unlock()

	addrs := s.addrs()
	slices.SortFunc(addrs, netip.Addr.Compare)
	addrs = slices.Compact(addrs)
	for nsn, hc := range s.services {
		if port, ok := newServices[nsn]; !ok || port != hc.port || !slices.Equal(addrs, hc.addrs) {
			klog.V(2).InfoS("Closing healthcheck", "service", nsn, "port", hc.port, "addresses", hc.addrs)
			hc.closeAll(nsn)
			delete(s.services, nsn)
		}
	}

	var errs []error
	for nsn, port := range newServices {
		if s.services[nsn] != nil {
			continue
		}
		klog.V(2).InfoS("Opening healthcheck", "service", nsn, "port", port, "addresses", addrs)
		hc, err := s.open(nsn, port, addrs)
		if err != nil {
			klog.ErrorS(err, "Failed to start healthcheck", "node", s.hostname, "service", nsn, "port", port)
			errs = append(errs, fmt.Errorf("node %s failed to start healthcheck %q on port %d: %w", s.hostname, nsn.String(), port, err))
			continue
		}
		s.services[nsn] = hc
	}
	return errors.Join(errs...)
}

// open listens on port on the addresses. On failure it closes what it
// opened, so that the port is free for a retry or another owner.
func (s *ServiceHealthServer) open(nsn types.NamespacedName, port uint16, addrs []netip.Addr) (*hcInstance, error) {
	hc := &hcInstance{port: port, addrs: addrs}
	handler := hcHandler{nsn: nsn, s: s}
	for _, na := range listenAddrs(addrs, port) {
		ln, err := s.listen(context.Background(), na[0], na[1])
		if err != nil {
			hc.closeAll(nsn)
			return nil, err
		}
		srv := &http.Server{Handler: handler, ReadHeaderTimeout: readHeaderTimeout}
		hc.servers = append(hc.servers, srv)
		hc.listeners = append(hc.listeners, ln)
		go func() {
			klog.V(3).InfoS("Starting healthcheck", "service", nsn, "address", ln.Addr().String())
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				klog.ErrorS(err, "Healthcheck stopped", "service", nsn, "address", ln.Addr().String())
			}
		}()
	}
	return hc, nil
}

func (hc *hcInstance) closeAll(nsn types.NamespacedName) {
	for _, srv := range hc.servers {
		// Close, not Shutdown: probes are cheap to repeat.
		if err := srv.Close(); err != nil {
			klog.ErrorS(err, "Error closing healthcheck server", "service", nsn)
		}
	}
	// Close the listeners too: srv.Close only closes those Serve has
	// started on, and Serve runs in its own goroutine. The port must be
	// free when this returns, for a service that takes it over.
	for _, ln := range hc.listeners {
		_ = ln.Close()
	}
	hc.servers, hc.listeners = nil, nil
}

// SyncEndpoints sets the number of local endpoints of each service. Services
// missing from newEndpoints have none; entries for services without a health
// check are ignored.
func (s *ServiceHealthServer) SyncEndpoints(newEndpoints map[types.NamespacedName]int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for nsn, hc := range s.services {
		hc.endpoints = newEndpoints[nsn]
		klog.V(4).InfoS("Reporting endpoints for healthcheck", "service", nsn, "endpointCount", hc.endpoints)
	}
	return nil
}

// Close stops every health check server.
func (s *ServiceHealthServer) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for nsn, hc := range s.services {
		hc.closeAll(nsn)
		delete(s.services, nsn)
	}
}

type hcHandler struct {
	nsn types.NamespacedName
	s   *ServiceHealthServer
}

// serviceHealthResponse is the JSON body; field order matters for
// byte-identical output with upstream.
type serviceHealthResponse struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

func (h hcHandler) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	h.s.mu.RLock()
	hc, ok := h.s.services[h.nsn]
	count := 0
	if ok {
		count = hc.endpoints
	}
	h.s.mu.RUnlock()
	if !ok {
		// The service was just removed and its server is closing. Upstream
		// answers an empty 200 here; 503 is the safe answer for a load
		// balancer.
		klog.V(2).InfoS("Request for closed healthcheck", "service", h.nsn)
	}
	healthy := h.s.health == nil || h.s.health.IsHealthy()

	var resp serviceHealthResponse
	resp.Service.Namespace = h.nsn.Namespace
	resp.Service.Name = h.nsn.Name
	resp.LocalEndpoints = count
	resp.ServiceProxyHealthy = healthy
	// Upstream prints this object indented with tabs; MarshalIndent gives
	// the same bytes.
	body, _ := json.MarshalIndent(resp, "", "\t")

	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	// GCE and others weight backends by this header.
	w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(count))
	if ok && count > 0 && healthy {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = w.Write(body)
}
