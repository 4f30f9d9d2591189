package apiserver

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	componentbaseconfigv1alpha1 "k8s.io/component-base/config/v1alpha1"

	"github.com/kproxy/kproxy/internal/model"
)

// wireRequest is what an API server saw of one request.
type wireRequest struct {
	path                   string
	query                  url.Values
	accept, acceptEncoding string
}

// TestWire runs the source with NewClient's defaults against a recording
// HTTP server and checks what every node asks the API server for: the
// first request of each watched resource is a streaming list (a watch
// with sendInitialEvents and bookmarks, served from the watch cache),
// with upstream's selectors, asking for protobuf and accepting gzip
// (which the API server applies to such streams). The server answers 500
// to everything; the reflectors retry, which does not matter here.
func TestWire(t *testing.T) {
	var mu sync.Mutex
	var reqs []wireRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		reqs = append(reqs, wireRequest{path: r.URL.Path, query: r.URL.Query(), accept: r.Header.Get("Accept"), acceptEncoding: r.Header.Get("Accept-Encoding")})
		mu.Unlock()
		http.Error(w, "recording only", http.StatusInternalServerError)
	}))
	defer srv.Close()
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte(strings.Replace(testKubeconfig, "https://127.0.0.1:6443", srv.URL, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	client, err := NewClient(kc, "", componentbaseconfigv1alpha1.ClientConnectionConfiguration{})
	if err != nil {
		t.Fatal(err)
	}

	paths := map[string]string{
		"services":       "/api/v1/services",
		"endpointslices": "/apis/discovery.k8s.io/v1/endpointslices",
		"nodes":          "/api/v1/nodes",
		"servicecidrs":   "/apis/networking.k8s.io/v1/servicecidrs",
	}
	first := func() map[string]wireRequest {
		mu.Lock()
		defer mu.Unlock()
		out := map[string]wireRequest{}
		for _, r := range reqs {
			for name, p := range paths {
				if _, seen := out[name]; !seen && r.path == p {
					out[name] = r
				}
			}
		}
		return out
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- New(client, hostname, 0).Run(ctx, model.NewTracker(model.TrackerOptions{Hostname: hostname}))
	}()
	for deadline := time.Now().Add(waitFor); len(first()) < len(paths) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done

	got := first()
	wantSelectors := map[string][2]string{
		"services":       {serviceLabelSelector, serviceFieldSelector},
		"endpointslices": {sliceLabelSelector, ""},
		"nodes":          {"", nodeFieldSelector(hostname)},
		"servicecidrs":   {"", ""},
	}
	for name := range paths {
		r, ok := got[name]
		if !ok {
			t.Errorf("%s: never requested", name)
			continue
		}
		q := r.query
		if q.Get("watch") != "true" || q.Get("sendInitialEvents") != "true" || q.Get("allowWatchBookmarks") != "true" {
			t.Errorf("%s: first request %s?%s, want a streaming list (watch, sendInitialEvents, allowWatchBookmarks)", name, r.path, q.Encode())
		}
		if sel := wantSelectors[name]; q.Get("labelSelector") != sel[0] || q.Get("fieldSelector") != sel[1] {
			t.Errorf("%s: selectors labels=%q fields=%q, want %q %q", name, q.Get("labelSelector"), q.Get("fieldSelector"), sel[0], sel[1])
		}
		if !strings.HasPrefix(r.accept, "application/vnd.kubernetes.protobuf") {
			t.Errorf("%s: Accept %q, want protobuf first", name, r.accept)
		}
		if !strings.Contains(r.acceptEncoding, "gzip") {
			t.Errorf("%s: Accept-Encoding %q, want gzip (the API server compresses streaming lists for clients that accept it)", name, r.acceptEncoding)
		}
	}
}
