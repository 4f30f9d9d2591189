package server

// /flagz and /statusz as upstream kube-proxy serves them on its metrics
// server (k8s.io/apiserver/pkg/server/flagz and statusz, installed when the
// ComponentFlagz and ComponentStatusz gates are on). kproxy writes them
// itself: linking k8s.io/apiserver for two debug pages would double the
// binary. The text/plain answer (the default, with no Accept header) is
// upstream's, including its header and its deliberately random delimiter;
// the structured answer is the v1beta1 JSON (Accept:
// application/json;g=config.k8s.io;v=v1beta1;as=Flagz or as=Statusz).
// YAML, CBOR and the deprecated v1alpha1 are answered 406.

import (
	"encoding/json"
	"fmt"
	"html"
	"math/rand/v2"
	"mime"
	"net/http"
	"runtime"
	"sort"
	"strings"
	"time"

	compbasemetrics "k8s.io/component-base/metrics"
)

// zpageDelimiters are upstream's; one is picked per answer so that nobody
// parses the text.
var zpageDelimiters = []string{":", ": ", "=", " "}

const (
	zpageComponent = "kube-proxy"
	zpageGroup     = "config.k8s.io"
	zpageVersion   = "v1beta1"
	zpageWarning   = "Warning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for debugging purposes only."
)

// StatuszInfo is what /statusz reports besides the process start time and
// the Go version.
type StatuszInfo struct {
	// BinaryVersion is kproxy's version.
	BinaryVersion string
	// EmulationVersion is the Kubernetes version whose kube-proxy kproxy
	// behaves as (major.minor).
	EmulationVersion string
}

// zpageFormat is what a request's Accept header asks for.
type zpageFormat int

const (
	zpageText zpageFormat = iota
	zpageJSON
	zpageNotAcceptable
)

// negotiateZpage picks text/plain or the structured JSON of kind as, in the
// order of the Accept header.
func negotiateZpage(r *http.Request, kind string) zpageFormat {
	accept := strings.TrimSpace(r.Header.Get("Accept"))
	if accept == "" {
		return zpageText
	}
	for _, part := range strings.Split(accept, ",") {
		mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		switch mt {
		case "text/plain", "text/*", "*/*":
			return zpageText
		case "application/json":
			if params["g"] == zpageGroup && params["v"] == zpageVersion && params["as"] == kind {
				return zpageJSON
			}
		}
	}
	return zpageNotAcceptable
}

func writeZpageJSON(w http.ResponseWriter, obj any) {
	body, err := json.Marshal(obj)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(append(body, '\n'))
}

func writeZpageNotAcceptable(w http.ResponseWriter, kind string) {
	writePlainText(w, http.StatusNotAcceptable, fmt.Sprintf(
		"only text/plain and application/json;g=%s;v=%s;as=%s are supported", zpageGroup, zpageVersion, kind))
}

func zpageHeader(name string) string {
	return fmt.Sprintf("\n%s %s\n%s\n", zpageComponent, name, zpageWarning)
}

type zpageMeta struct {
	Name string `json:"name"`
}

// flagzHandler serves /flagz: every flag and its value.
func flagzHandler(flags func() map[string]string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		values := flags()
		switch negotiateZpage(r, "Flagz") {
		case zpageJSON:
			writeZpageJSON(w, struct {
				Kind       string            `json:"kind"`
				APIVersion string            `json:"apiVersion"`
				Metadata   zpageMeta         `json:"metadata"`
				Flags      map[string]string `json:"flags,omitempty"`
			}{"Flagz", zpageGroup + "/" + zpageVersion, zpageMeta{zpageComponent}, values})
		case zpageText:
			sep := zpageDelimiters[rand.IntN(len(zpageDelimiters))]
			names := make([]string, 0, len(values))
			for n := range values {
				names = append(names, n)
			}
			sort.Strings(names)
			var b strings.Builder
			b.WriteString(zpageHeader("flagz"))
			for _, n := range names {
				fmt.Fprintf(&b, "%s%s%s\n", n, sep, values[n])
			}
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_, _ = w.Write([]byte(b.String()))
		default:
			writeZpageNotAcceptable(w, "Flagz")
		}
	}
}

// statuszHandler serves /statusz: start time, uptime, versions and the
// top-level paths of the server.
func statuszHandler(info StatuszInfo, paths []string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		startSec, _ := compbasemetrics.GetProcessStart()
		start := time.Unix(int64(startSec), 0)
		up := int64(time.Since(start).Seconds())
		switch negotiateZpage(r, "Statusz") {
		case zpageJSON:
			writeZpageJSON(w, struct {
				Kind             string    `json:"kind"`
				APIVersion       string    `json:"apiVersion"`
				Metadata         zpageMeta `json:"metadata"`
				StartTime        time.Time `json:"startTime"`
				UptimeSeconds    int64     `json:"uptimeSeconds"`
				GoVersion        string    `json:"goVersion"`
				BinaryVersion    string    `json:"binaryVersion"`
				EmulationVersion string    `json:"emulationVersion,omitempty"`
				Paths            []string  `json:"paths"`
			}{"Statusz", zpageGroup + "/" + zpageVersion, zpageMeta{zpageComponent}, start.UTC(), up,
				runtime.Version(), info.BinaryVersion, info.EmulationVersion, paths})
		case zpageText:
			delim := html.EscapeString(zpageDelimiters[rand.IntN(len(zpageDelimiters))])
			var emulation, listed string
			if info.EmulationVersion != "" {
				emulation = fmt.Sprintf("Emulation version%s %s", delim, html.EscapeString(info.EmulationVersion))
			}
			if len(paths) > 0 {
				listed = fmt.Sprintf("Paths%s %s", delim, html.EscapeString(strings.Join(paths, " ")))
			}
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_, _ = fmt.Fprintf(w, "%s\nStarted%[2]s %[3]s\nUp%[2]s %[4]s\nGo version%[2]s %[5]s\nBinary version%[2]s %[6]s\n%[7]s\n%[8]s\n",
				zpageHeader("statusz"), delim, html.EscapeString(start.Format(time.UnixDate)),
				fmt.Sprintf("%d hr %02d min %02d sec", up/3600, (up/60)%60, up%60),
				html.EscapeString(runtime.Version()), html.EscapeString(info.BinaryVersion), emulation, listed)
		default:
			writeZpageNotAcceptable(w, "Statusz")
		}
	}
}

// topLevelPaths lists the first path segment of each path once, sorted,
// as upstream's statusz does with its mux's paths.
func topLevelPaths(paths []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, p := range paths {
		parts := strings.Split(p, "/")
		if len(parts) < 2 || parts[1] == "" {
			continue
		}
		if f := "/" + parts[1]; !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	sort.Strings(out)
	return out
}
