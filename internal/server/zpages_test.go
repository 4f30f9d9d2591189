package server

import (
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"
)

// zpageDelim matches any of upstream's random delimiters.
const zpageDelim = `(:|: |=| )`

func getAccept(t *testing.T, url, accept string) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return response{code: resp.StatusCode, header: resp.Header, body: b.String()}
}

func TestZpagesOffByDefault(t *testing.T) {
	addr := startMetrics(t, MetricsServerConfig{})
	for _, p := range []string{"/flagz", "/statusz"} {
		if code := get(t, httpURL(addr, p)).code; code != http.StatusNotFound {
			t.Errorf("%s without the gate: code %d, want 404", p, code)
		}
	}
}

func TestFlagz(t *testing.T) {
	addr := startMetrics(t, MetricsServerConfig{Flagz: func() map[string]string {
		return map[string]string{"proxy-mode": "nftables", "v": "2", "cluster-cidr": ""}
	}})

	for _, accept := range []string{"", "text/plain", "*/*"} {
		resp := getAccept(t, httpURL(addr, "/flagz"), accept)
		if resp.code != http.StatusOK || resp.header.Get("Content-Type") != "text/plain; charset=utf-8" {
			t.Fatalf("Accept %q: code %d, Content-Type %q", accept, resp.code, resp.header.Get("Content-Type"))
		}
		want := regexp.MustCompile(`^
kube-proxy flagz
Warning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for debugging purposes only.
cluster-cidr` + zpageDelim + `
proxy-mode` + zpageDelim + `nftables
v` + zpageDelim + `2
$`)
		if !want.MatchString(resp.body) {
			t.Errorf("Accept %q: /flagz body:\n%s", accept, resp.body)
		}
	}

	resp := getAccept(t, httpURL(addr, "/flagz"), "application/json;g=config.k8s.io;v=v1beta1;as=Flagz")
	if resp.code != http.StatusOK || resp.header.Get("Content-Type") != "application/json" {
		t.Fatalf("structured /flagz: code %d, Content-Type %q: %s", resp.code, resp.header.Get("Content-Type"), resp.body)
	}
	var obj struct {
		Kind       string `json:"kind"`
		APIVersion string `json:"apiVersion"`
		Metadata   struct{ Name string }
		Flags      map[string]string `json:"flags"`
	}
	if err := json.Unmarshal([]byte(resp.body), &obj); err != nil {
		t.Fatal(err)
	}
	if obj.Kind != "Flagz" || obj.APIVersion != "config.k8s.io/v1beta1" || obj.Metadata.Name != "kube-proxy" || obj.Flags["proxy-mode"] != "nftables" {
		t.Errorf("structured /flagz = %+v", obj)
	}

	if code := getAccept(t, httpURL(addr, "/flagz"), "application/yaml").code; code != http.StatusNotAcceptable {
		t.Errorf("Accept application/yaml: code %d, want 406", code)
	}
}

func TestStatusz(t *testing.T) {
	addr := startMetrics(t, MetricsServerConfig{
		Flagz:   func() map[string]string { return nil },
		Statusz: &StatuszInfo{BinaryVersion: "v0.1.0-test", EmulationVersion: "1.37"},
	})
	resp := getAccept(t, httpURL(addr, "/statusz"), "")
	if resp.code != http.StatusOK {
		t.Fatalf("/statusz: code %d", resp.code)
	}
	want := regexp.MustCompile(`^
kube-proxy statusz
Warning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for debugging purposes only.

Started` + zpageDelim + ` \w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \w+ \d{4}
Up` + zpageDelim + ` \d+ hr \d\d min \d\d sec
Go version` + zpageDelim + ` go[\w.]+
Binary version` + zpageDelim + ` v0\.1\.0-test
Emulation version` + zpageDelim + ` 1\.37
Paths` + zpageDelim + ` /configz /flagz /healthz /metrics /proxyMode
$`)
	if !want.MatchString(resp.body) {
		t.Errorf("/statusz body:\n%q", resp.body)
	}

	resp = getAccept(t, httpURL(addr, "/statusz"), "application/json;g=config.k8s.io;v=v1beta1;as=Statusz")
	var obj struct {
		Kind             string   `json:"kind"`
		APIVersion       string   `json:"apiVersion"`
		BinaryVersion    string   `json:"binaryVersion"`
		EmulationVersion string   `json:"emulationVersion"`
		Paths            []string `json:"paths"`
		UptimeSeconds    *int64   `json:"uptimeSeconds"`
	}
	if err := json.Unmarshal([]byte(resp.body), &obj); err != nil {
		t.Fatalf("structured /statusz: %v: %s", err, resp.body)
	}
	if obj.Kind != "Statusz" || obj.APIVersion != "config.k8s.io/v1beta1" || obj.BinaryVersion != "v0.1.0-test" ||
		obj.EmulationVersion != "1.37" || strings.Join(obj.Paths, " ") != "/configz /flagz /healthz /metrics /proxyMode" || obj.UptimeSeconds == nil {
		t.Errorf("structured /statusz = %+v", obj)
	}
	// Asking for Flagz at /statusz is not acceptable.
	if code := getAccept(t, httpURL(addr, "/statusz"), "application/json;g=config.k8s.io;v=v1beta1;as=Flagz").code; code != http.StatusNotAcceptable {
		t.Errorf("as=Flagz at /statusz: code %d, want 406", code)
	}
}
