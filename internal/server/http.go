package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/component-base/metrics/prometheus/slis"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kproxy/kproxy/internal/metrics"
)

// ListenFunc opens a listening socket, like net.ListenConfig.Listen. It is
// the seam tests use to bind to 127.0.0.1 and learn the chosen port.
type ListenFunc func(ctx context.Context, network, address string) (net.Listener, error)

// DefaultListen is net.ListenConfig{}.Listen.
func DefaultListen(ctx context.Context, network, address string) (net.Listener, error) {
	var lc net.ListenConfig
	return lc.Listen(ctx, network, address)
}

const (
	// bindRetryInterval is how long to wait before binding again after a
	// failure when bindAddressHardFail is off: upstream runs its servers
	// under wait.Until with this period.
	bindRetryInterval = 5 * time.Second
	// shutdownTimeout bounds the graceful shutdown of a server when its
	// context ends; requests here are short.
	shutdownTimeout = 5 * time.Second
	// readHeaderTimeout keeps a client that never finishes its request
	// headers from holding a connection forever.
	readHeaderTimeout = 10 * time.Second
)

// httpServer is the bind/serve/retry loop shared by the healthz and metrics
// servers.
type httpServer struct {
	name     string
	addr     string
	handler  http.Handler
	hardFail bool
	listen   ListenFunc
	clk      clock.WithTicker
}

// run serves until ctx is done. An empty address disables the server, as
// upstream. On a bind or serve failure it returns the error when hardFail
// is set (the caller then exits, as upstream's bindAddressHardFail), and
// otherwise logs it and tries again after bindRetryInterval.
func (s *httpServer) run(ctx context.Context) error {
	if s.addr == "" {
		klog.V(2).InfoS("Server disabled: no bind address", "server", s.name)
		return nil
	}
	for {
		err := s.serveOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if s.hardFail {
			return err
		}
		klog.ErrorS(err, "Server failed, will retry", "server", s.name, "address", s.addr, "retryInterval", bindRetryInterval)
		t := s.clk.NewTimer(bindRetryInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
	}
}

// serveOnce binds and serves until ctx is done (nil) or serving fails.
func (s *httpServer) serveOnce(ctx context.Context) error {
	ln, err := s.listen(ctx, "tcp", s.addr)
	if err != nil {
		return fmt.Errorf("failed to start %s server on %s: %w", s.name, s.addr, err)
	}
	klog.InfoS("Serving", "server", s.name, "address", ln.Addr().String())
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: readHeaderTimeout,
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		// Serve closed the listener already.
		return fmt.Errorf("%s server on %s stopped: %w", s.name, s.addr, err)
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			klog.V(2).InfoS("Graceful shutdown incomplete, closing", "server", s.name, "err", err)
			_ = srv.Close()
		}
		<-served
		return nil
	}
}

// HealthzServerConfig configures a HealthzServer.
type HealthzServerConfig struct {
	// BindAddress is healthzBindAddress (default 0.0.0.0:10256). Empty
	// disables the server.
	BindAddress string
	// BindAddressHardFail makes Run return bind and serve errors instead of
	// retrying.
	BindAddressHardFail bool
	// Health answers the probes.
	Health *ProxyHealth
	// Listen opens the socket; nil means DefaultListen.
	Listen ListenFunc
	// Clock paces bind retries; nil means the real clock.
	Clock clock.WithTicker
}

// HealthzServer serves /healthz and /livez.
type HealthzServer struct {
	srv httpServer
}

// NewHealthzServer returns a HealthzServer; call Run to serve.
func NewHealthzServer(cfg HealthzServerConfig) *HealthzServer {
	mux := http.NewServeMux()
	mux.Handle("/healthz", cfg.Health.HealthzHandler())
	mux.Handle("/livez", cfg.Health.LivezHandler())
	return &HealthzServer{srv: newHTTPServer("healthz", cfg.BindAddress, mux, cfg.BindAddressHardFail, cfg.Listen, cfg.Clock)}
}

// Run serves until ctx is done. See MetricsServer.Run for error handling.
func (s *HealthzServer) Run(ctx context.Context) error {
	return s.srv.run(ctx)
}

// ConfigzGroup is the key upstream's /configz puts the configuration under.
const ConfigzGroup = "kubeproxy.config.k8s.io"

// MetricsServerConfig configures a MetricsServer.
type MetricsServerConfig struct {
	// BindAddress is metricsBindAddress (default 127.0.0.1:10249). Empty
	// disables the server.
	BindAddress string
	// BindAddressHardFail makes Run return bind and serve errors instead of
	// retrying.
	BindAddressHardFail bool
	// Gatherer is served on /metrics; nil means metrics.Gatherer.
	Gatherer prometheus.Gatherer
	// ProxyMode returns the text of /proxyMode. A func, so that it can
	// include facts known only after start (e.g. the iptables backend).
	ProxyMode func() string
	// ProxyBackend names what implements the mode ("nftables", or the
	// iptables backend "legacy" / "nft"). /proxyMode keeps upstream's body
	// (the mode alone, which scripts compare) and carries the backend in
	// the X-Kproxy-Backend header, and in the body with ?verbose.
	ProxyBackend func() string
	// Configz returns the configuration served on /configz; nil serves an
	// empty object.
	Configz func() any
	// EnableProfiling adds /debug/pprof/ and /debug/flags/v.
	EnableProfiling bool
	// Flagz, when set, serves /flagz with these flags and values (upstream:
	// when the ComponentFlagz gate is on).
	Flagz func() map[string]string
	// Statusz, when set, serves /statusz (upstream: when the
	// ComponentStatusz gate is on).
	Statusz *StatuszInfo
	// Listen opens the socket; nil means DefaultListen.
	Listen ListenFunc
	// Clock paces bind retries; nil means the real clock.
	Clock clock.WithTicker
}

// MetricsServer serves /metrics, /metrics/slis, /proxyMode, /configz,
// /healthz, /flagz and /statusz when configured and, with profiling,
// /debug/pprof/ and /debug/flags/v.
type MetricsServer struct {
	srv     httpServer
	handler http.Handler
}

// NewMetricsServer returns a MetricsServer; call Run to serve.
func NewMetricsServer(cfg MetricsServerConfig) *MetricsServer {
	h := newMetricsHandler(cfg)
	return &MetricsServer{
		srv:     newHTTPServer("metrics", cfg.BindAddress, h, cfg.BindAddressHardFail, cfg.Listen, cfg.Clock),
		handler: h,
	}
}

// Handler returns the server's request router.
func (s *MetricsServer) Handler() http.Handler {
	return s.handler
}

// Run serves until ctx is done, then shuts down and returns nil. With an
// empty bind address it returns nil at once. If binding or serving fails it
// returns the error when BindAddressHardFail is set; otherwise it logs the
// error and tries again every 5 seconds, as upstream.
func (s *MetricsServer) Run(ctx context.Context) error {
	return s.srv.run(ctx)
}

func newHTTPServer(name, addr string, h http.Handler, hardFail bool, listen ListenFunc, clk clock.WithTicker) httpServer {
	if listen == nil {
		listen = DefaultListen
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	return httpServer{name: name, addr: addr, handler: h, hardFail: hardFail, listen: listen, clk: clk}
}

func newMetricsHandler(cfg MetricsServerConfig) http.Handler {
	gatherer := cfg.Gatherer
	if gatherer == nil {
		gatherer = metrics.Gatherer
	}
	mux := http.NewServeMux()
	// listed are the paths upstream's mux lists (shown by /statusz); its
	// /debug/ handlers are unlisted.
	listed := []string{"/healthz", "/metrics/slis", "/proxyMode", "/metrics", "/configz"}

	// Upstream installs the generic healthz handler with its default "ping"
	// check: the answer only says the process serves HTTP.
	mux.HandleFunc("/healthz", pingHealthz)
	mux.HandleFunc("/healthz/ping", pingHealthz)
	// /metrics/slis: the healthz check results (kubernetes_healthcheck,
	// kubernetes_healthchecks_total), reset by DELETE, as upstream.
	slis.SLIMetricsWithReset{}.Install(mux)

	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, r *http.Request) {
		mode, backend := "", ""
		if cfg.ProxyMode != nil {
			mode = cfg.ProxyMode()
		}
		if cfg.ProxyBackend != nil {
			backend = cfg.ProxyBackend()
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if backend != "" {
			w.Header().Set("X-Kproxy-Backend", backend)
			if r.URL.Query().Has("verbose") {
				mode += " (backend: " + backend + ")"
			}
		}
		_, _ = io.WriteString(w, mode)
	})

	mux.Handle("/metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{
		// A failing collector must not hide every other metric.
		ErrorHandling: promhttp.ContinueOnError,
		ErrorLog:      klogPromLogger{},
	}))

	mux.HandleFunc("/configz", func(w http.ResponseWriter, _ *http.Request) {
		// Upstream serves every registered component config under its group
		// name; kube-proxy registers one.
		out := map[string]any{}
		if cfg.Configz != nil {
			out[ConfigzGroup] = cfg.Configz()
		}
		body, err := json.Marshal(out)
		if err != nil {
			http.Error(w, fmt.Sprintf("error marshaling json: %v", err), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = w.Write(body)
	})

	if cfg.EnableProfiling {
		mux.Handle("/debug/pprof", http.RedirectHandler("/debug/pprof/", http.StatusMovedPermanently))
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		mux.HandleFunc("/debug/flags/v", setVerbosity)
	}
	if cfg.Flagz != nil {
		mux.Handle("/flagz", flagzHandler(cfg.Flagz))
		listed = append(listed, "/flagz")
	}
	if cfg.Statusz != nil {
		mux.Handle("/statusz", statuszHandler(*cfg.Statusz, topLevelPaths(listed)))
	}
	return mux
}

func pingHealthz(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/healthz" {
		// Upstream's root healthz handler records each check it runs;
		// /healthz/ping alone does not.
		_ = slis.ObserveHealthcheck(r.Context(), "ping", "healthz", slis.Success)
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if _, verbose := r.URL.Query()["verbose"]; verbose && r.URL.Path == "/healthz" {
		_, _ = io.WriteString(w, "[+]ping ok\nhealthz check passed\n")
		return
	}
	_, _ = io.WriteString(w, "ok")
}

// setVerbosity serves /debug/flags/v: PUT a number to change klog's -v at
// run time, as upstream's DebugFlags handler.
func setVerbosity(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPut {
		writePlainText(w, http.StatusNotAcceptable, "unsupported http method")
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 64))
	if err != nil {
		writePlainText(w, http.StatusBadRequest, "error reading request body: "+err.Error())
		return
	}
	val := string(body)
	if _, err := strconv.ParseUint(val, 10, 32); err != nil {
		writePlainText(w, http.StatusBadRequest, err.Error())
		return
	}
	var level klog.Level
	if err := level.Set(val); err != nil {
		writePlainText(w, http.StatusBadRequest, fmt.Sprintf("failed set klog.logging.verbosity %s: %v", val, err))
		return
	}
	writePlainText(w, http.StatusOK, "successfully set klog.logging.verbosity to "+val)
}

func writePlainText(w http.ResponseWriter, code int, text string) {
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = fmt.Fprintln(w, text)
}

// klogPromLogger sends promhttp's errors to klog.
type klogPromLogger struct{}

func (klogPromLogger) Println(v ...any) {
	klog.ErrorS(errors.New(fmt.Sprint(v...)), "Error serving metrics")
}
