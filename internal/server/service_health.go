package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
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
	// nodeIPs are the addresses to listen on; empty means all addresses.
	nodeIPs []netip.Addr
	health  *ProxyHealth
	listen  ListenFunc

	mu       sync.RWMutex
	services map[types.NamespacedName]*hcInstance
}

// hcInstance is one service's health check: one HTTP server per node IP.
type hcInstance struct {
	port      uint16
	servers   []*http.Server
	listeners []net.Listener
	endpoints int // local endpoints
}

// NewServiceHealthServer returns a ServiceHealthServer. hostname names the
// node in errors. nodeIPs are the addresses to listen on (upstream listens
// on the nodePortAddresses the node has); empty means all addresses. A nil
// health counts as always healthy. A nil listen means DefaultListen.
func NewServiceHealthServer(hostname string, nodeIPs []netip.Addr, health *ProxyHealth, listen ListenFunc) *ServiceHealthServer {
	if listen == nil {
		listen = DefaultListen
	}
	return &ServiceHealthServer{
		hostname: hostname,
		nodeIPs:  append([]netip.Addr(nil), nodeIPs...),
		health:   health,
		listen:   listen,
		services: map[types.NamespacedName]*hcInstance{},
	}
}

// SyncServices makes newServices (service → health check node port) the set
// being served: services no longer present, or whose port changed, are
// closed; new ones are opened; unchanged ones keep their listeners and
// endpoint counts. A service whose port cannot be opened is skipped and
// reported in the returned error; the next SyncServices tries it again.
func (s *ServiceHealthServer) SyncServices(newServices map[types.NamespacedName]uint16) error {
	s.mu.Lock()
	defer s.mu.Unlock()

	for nsn, hc := range s.services {
		if port, ok := newServices[nsn]; !ok || port != hc.port {
			klog.V(2).InfoS("Closing healthcheck", "service", nsn, "port", hc.port)
			hc.closeAll(nsn)
			delete(s.services, nsn)
		}
	}

	var errs []error
	for nsn, port := range newServices {
		if s.services[nsn] != nil {
			continue
		}
		klog.V(2).InfoS("Opening healthcheck", "service", nsn, "port", port)
		hc, err := s.open(nsn, port)
		if err != nil {
			klog.ErrorS(err, "Failed to start healthcheck", "node", s.hostname, "service", nsn, "port", port)
			errs = append(errs, fmt.Errorf("node %s failed to start healthcheck %q on port %d: %w", s.hostname, nsn.String(), port, err))
			continue
		}
		s.services[nsn] = hc
	}
	return errors.Join(errs...)
}

// open listens on port on every node IP. On failure it closes what it
// opened, so that the port is free for a retry or another owner.
func (s *ServiceHealthServer) open(nsn types.NamespacedName, port uint16) (*hcInstance, error) {
	hc := &hcInstance{port: port}
	addrs := []string{net.JoinHostPort("", strconv.Itoa(int(port)))}
	if len(s.nodeIPs) > 0 {
		addrs = addrs[:0]
		for _, ip := range s.nodeIPs {
			addrs = append(addrs, netip.AddrPortFrom(ip, port).String())
		}
	}
	handler := hcHandler{nsn: nsn, s: s}
	for _, addr := range addrs {
		ln, err := s.listen(context.Background(), "tcp", addr)
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
