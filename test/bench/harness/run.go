package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kproxy/kproxy/test/bench/cluster"
)

// Config is one benchmark run.
type Config struct {
	Services []int       `json:"services"`
	Mix      cluster.Mix `json:"mix"`
	Seed     uint64      `json:"seed"`
	Modes    []string    `json:"modes"`
	Proxies  []Proxy     `json:"proxies"`
	Reps     int         `json:"reps"`
	// FileSource measures kproxy alone with the file source; APIServer
	// runs every proxy against a real kube-apiserver; DataPlane adds the
	// connect measurement to the API server runs.
	FileSource bool `json:"fileSource"`
	APIServer  bool `json:"apiServer"`
	DataPlane  bool `json:"dataPlane"`
	// Changes is how many endpoint changes each API server run makes;
	// FileChanges, when not zero, how many of each single change a file
	// source run makes (5 endpoint flips, 3 of the others by default).
	Changes     int `json:"changes"`
	FileChanges int `json:"fileChanges,omitempty"`
	// ChangeGap is the rest after each API server change is programmed
	// before the next is made (0: 3 s, a proxy at rest; shorter gaps
	// show how a proxy copes with a rollout's steady trickle).
	ChangeGap time.Duration `json:"changeGap,omitempty"`
	// Quick shortens the waits (the first sync's quiet window, the
	// settling before RSS is read, the rest between changes) to a third:
	// for the test that keeps the harness working, not for figures.
	Quick bool `json:"quick,omitempty"`
	// Soak, when not zero, makes that many endpoint changes over SoakFor
	// against the API server, after the repetitions, for each proxy named
	// in SoakProxies (all when empty), in the first mode.
	Soak        int           `json:"soak,omitempty"`
	SoakFor     time.Duration `json:"soakFor,omitempty"`
	SoakProxies []string      `json:"soakProxies,omitempty"`
	// SoakProfile, when set, is a directory for a CPU profile of up to
	// 30 s of each soaking proxy, taken in the middle of its soak, and
	// heap profiles of its settled and end moments (runSoak).
	SoakProfile string `json:"soakProfile,omitempty"`
	// LogDir, when set, keeps every proxy's log: LogDir/<run>/<proxy>.log,
	// <run> naming the service count, proxy, mode and rep.
	LogDir string `json:"logDir,omitempty"`
}

// Report is what a run measured; WriteReport writes it.
type Report struct {
	Config  Config       `json:"config"`
	Started time.Time    `json:"started"`
	Ended   time.Time    `json:"ended"`
	Machine string       `json:"machine"`
	File    []FileResult `json:"file,omitempty"`
	API     []APIResult  `json:"api,omitempty"`
	Soak    []SoakResult `json:"soak,omitempty"`
	// Errors are runs that failed (the others still count).
	Errors []string `json:"errors,omitempty"`
}

// Validate says what is wrong with cfg, all at once.
func (cfg *Config) Validate() error {
	var errs []string
	if len(cfg.Services) == 0 {
		errs = append(errs, "no service counts")
	}
	for _, m := range cfg.Modes {
		if !slices.Contains(knownModes, m) {
			errs = append(errs, fmt.Sprintf("mode %q: want one of %s", m, strings.Join(knownModes, ",")))
		}
	}
	if cfg.Reps < 1 {
		errs = append(errs, "reps must be at least 1")
	}
	for _, p := range cfg.Proxies {
		if _, err := os.Stat(p.Bin); err != nil {
			errs = append(errs, fmt.Sprintf("proxy %s: %v", p.Name, err))
		}
	}
	if cfg.Soak > 0 {
		if !cfg.APIServer || len(cfg.Modes) == 0 {
			errs = append(errs, "a soak runs against the API server: it needs the apiserver measurement and a mode")
		}
		if cfg.SoakFor <= 0 {
			errs = append(errs, "a soak needs a duration")
		}
		for _, name := range cfg.SoakProxies {
			if !slices.ContainsFunc(cfg.Proxies, func(p Proxy) bool { return p.Name == name }) {
				errs = append(errs, fmt.Sprintf("soak proxy %q is not one of the proxies", name))
			}
		}
	}
	if !cfg.FileSource && !cfg.APIServer {
		errs = append(errs, "nothing to measure: neither the file source nor the API server")
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// logDir is Config.LogDir of the run in progress (see logDirFor).
var logDir string

// logDirFor is where a proxy started in tb's scope writes its log: a
// directory under the run's LogDir named after the scope, or a temporary
// one removed with the scope.
func logDirFor(tb *TB) string {
	if logDir == "" {
		return tb.TempDir()
	}
	dir := filepath.Join(logDir, strings.NewReplacer("/", "_", " ", "_").Replace(strings.TrimPrefix(tb.Name(), "/")))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatalf("log directory: %v", err)
	}
	return dir
}

// Run measures cfg. A failed run (one proxy, mode, rep) is reported in
// Report.Errors and the others go on; an interrupt ends the whole run
// with what was measured so far. Every namespace and process a run made
// is gone when Run returns.
func Run(tb *TB, cfg Config) *Report {
	r := &Report{Config: cfg, Started: time.Now().UTC(), Machine: machine()}
	logDir = cfg.LogDir
	pace = 1
	if cfg.Quick {
		pace = 1.0 / 3
	}
	fail := func(err error) {
		if err != nil {
			tb.Logf("FAILED: %v", err)
			r.Errors = append(r.Errors, err.Error())
		}
	}
	kproxy := -1
	for i, p := range cfg.Proxies {
		if p.Name == "kproxy" {
			kproxy = i
		}
	}
	for _, n := range cfg.Services {
		if tb.Context().Err() != nil {
			break
		}
		opts := cluster.Options{Services: n, Mix: cfg.Mix, Seed: cfg.Seed}
		if cfg.FileSource && kproxy >= 0 {
			for rep := range cfg.Reps {
				for _, mode := range cfg.Modes {
					if tb.Context().Err() != nil {
						break
					}
					tb.Logf("[file source] %d services, %s, rep %d/%d", n, mode, rep+1, cfg.Reps)
					fail(tb.Scope(fmt.Sprintf("file-%d-%s-%d", n, mode, rep), func(tb *TB) {
						c, err := cluster.Generate(opts)
						if err != nil {
							tb.Fatal(err)
						}
						fr := runFile(tb, cfg.Proxies[kproxy].Bin, mode, c, rep, cfg.FileChanges)
						r.File = append(r.File, fr)
						if fr.Error != "" {
							r.Errors = append(r.Errors, fmt.Sprintf("file source, %d services, %s: %s", n, mode, fr.Error))
						}
					}))
				}
			}
		}
		if cfg.APIServer && tb.Context().Err() == nil {
			fail(tb.Scope(fmt.Sprintf("api-%d", n), func(tb *TB) {
				c, err := cluster.Generate(opts)
				if err != nil {
					tb.Fatal(err)
				}
				tb.Logf("[API server] %d services: starting etcd and kube-apiserver, creating the objects", n)
				a := startAPICluster(tb, c)
				for rep := range cfg.Reps {
					// Alternate which proxy goes first.
					order := slices.Clone(cfg.Proxies)
					if rep%2 == 1 {
						slices.Reverse(order)
					}
					for _, mode := range cfg.Modes {
						for _, p := range order {
							if tb.Context().Err() != nil {
								return
							}
							tb.Logf("[API server] %d services, %s %s, rep %d/%d", n, p.Name, mode, rep+1, cfg.Reps)
							fail(tb.Scope(fmt.Sprintf("%s-%s-%d", p.Name, mode, rep), func(tb *TB) {
								r.API = append(r.API, a.runAPI(tb, p, mode, rep, cfg.Changes, cfg.ChangeGap, cfg.DataPlane))
							}))
						}
					}
				}
				for _, p := range cfg.Proxies {
					if cfg.Soak == 0 || (len(cfg.SoakProxies) > 0 && !slices.Contains(cfg.SoakProxies, p.Name)) {
						continue
					}
					if tb.Context().Err() != nil {
						return
					}
					tb.Logf("[API server] %d services, %s %s: soak of %d changes over %s", n, p.Name, cfg.Modes[0], cfg.Soak, cfg.SoakFor)
					fail(tb.Scope(fmt.Sprintf("soak-%s-%s", p.Name, cfg.Modes[0]), func(tb *TB) {
						r.Soak = append(r.Soak, a.runSoak(tb, p, cfg.Modes[0], cfg.Soak, cfg.SoakFor, cfg.SoakProfile))
					}))
				}
			}))
		}
	}
	if tb.Context().Err() != nil {
		r.Errors = append(r.Errors, "interrupted")
	}
	r.Ended = time.Now().UTC()
	return r
}

// machine is the kernel and CPU count, for the report.
func machine() string {
	out, _ := exec.Command("uname", "-srm").Output()
	cpus, _ := exec.Command("nproc").Output()
	return strings.TrimSpace(string(out)) + ", " + strings.TrimSpace(string(cpus)) + " CPUs"
}

// pace scales the harness's waits (Config.Quick).
var pace = 1.0

// wait is d scaled by pace.
func wait(d time.Duration) time.Duration { return time.Duration(float64(d) * pace) }
