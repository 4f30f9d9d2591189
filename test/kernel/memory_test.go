package kernel

// Memory pressure: a cgroup limit near the working set. kproxy runs in a
// cgroup v2 memory cgroup of its own, born there (netns.StartProcessIn),
// with memServices generated services from its snapshot file beside the
// example's, watched like every fault case (faults_test.go: three
// long-lived streams, a prober, a /healthz poller). Addresses as there;
// generated services on 198.19.10.1 onwards.
//
// The CI host mounts cgroup v2 with only the hugetlb controller (memory is
// on the v1 hierarchy), so TestInVM runs the test in the test VM, where it
// mounts cgroup2 with the memory controller itself.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/testutil/netns"
	"github.com/kproxy/kproxy/internal/testutil/vm"
)

const (
	// memServices are generated services in the snapshot from the start:
	// something to hold (rules, model, the file source's objects). Not
	// thousands: in the emulated VM (no KVM) kproxy took 60 s to read
	// 2,015 services and 10-36 s per full sync of them.
	memServices = 600
	// memStep more services come with each stage's change.
	memStep = 100
	// memSyncPeriod is kproxy's sync period here: longer than the fault
	// cases' 2 s, which is shorter than a full sync in the VM.
	memSyncPeriod = 10 * time.Second
	// memHealthTimeout is kproxy's health timeout: twice the sync period,
	// as upstream.
	memHealthTimeout = 2 * memSyncPeriod
	// memCgroupMount is where the test mounts cgroup2 when no mount with
	// the memory controller exists (in the test VM). Not under /sys:
	// `ip netns exec` remounts /sys.
	memCgroupMount = "/run/kproxy-test-cgroup2"
)

// TestMemoryPressure: kproxy (nftables mode) in a memory cgroup whose
// memory.max is set to 1.2 times its working set (memory.current without
// the page cache), then to 0.8 times its anonymous and kernel memory (what
// cannot be reclaimed without swap), each time with a change that adds
// memStep services. What happens is
// reported (a "memory:" line per stage: kept up and synced, or OOM-killed;
// the cgroup's memory.events); what must hold is asserted:
//   - the streams to unchanged services survive, no new connection to
//     them fails (the rules stay when kproxy dies);
//   - while the change is not in the rules for longer than the health
//     timeout (plus the file source's reread and a poll), /healthz never
//     answers 200: 503, or nothing when kproxy is dead;
//   - once the limit is lifted (and kproxy restarted if it died, as a
//     supervisor would), the change is programmed and /healthz is 200.
func TestMemoryPressure(t *testing.T) {
	requireKernel(t)
	if err := memoryCgroupUnsupported(); err != nil {
		skipForVM(t, err)
	}
	for _, bin := range nftablesMode.needs {
		netns.Require(t, bin)
	}
	testMemoryPressure(t, nftablesMode)
}

// memoryCgroupUnsupported says why no memory cgroup can be had here (no
// cgroup v2 mount has the memory controller), or nil. In the test VM the
// test mounts one itself.
func memoryCgroupUnsupported() error {
	if vm.InVM() {
		return nil
	}
	mounts, err := cgroup2Mounts()
	if err != nil {
		return err
	}
	var seen []string
	for _, m := range mounts {
		c, _ := os.ReadFile(filepath.Join(m, "cgroup.controllers"))
		if hasWord(string(c), "memory") {
			return nil
		}
		seen = append(seen, fmt.Sprintf("%s has %q", m, strings.TrimSpace(string(c))))
	}
	if len(seen) == 0 {
		return errors.New("no cgroup v2 mount")
	}
	return fmt.Errorf("no cgroup v2 mount with the memory controller (%s)", strings.Join(seen, "; "))
}

// cgroup2Mounts lists the mount points of the cgroup v2 hierarchy's root.
func cgroup2Mounts() ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var ms []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if ok && len(f) >= 5 && len(g) >= 1 && g[0] == "cgroup2" && f[3] == "/" {
			ms = append(ms, f[4])
		}
	}
	return ms, sc.Err()
}

func hasWord(s, w string) bool {
	for _, f := range strings.Fields(s) {
		if f == w {
			return true
		}
	}
	return false
}

// newMemoryCgroup makes a fresh cgroup with the memory controller and no
// limit; it is removed at the end of the test (after kproxy stops: its
// cleanup runs later).
func newMemoryCgroup(t *testing.T) string {
	t.Helper()
	mounts, err := cgroup2Mounts()
	if err != nil {
		t.Fatal(err)
	}
	root := ""
	for _, m := range mounts {
		if c, _ := os.ReadFile(filepath.Join(m, "cgroup.controllers")); hasWord(string(c), "memory") {
			root = m
			break
		}
	}
	if root == "" {
		if !vm.InVM() {
			t.Fatal("no cgroup v2 mount with the memory controller")
		}
		if err := os.MkdirAll(memCgroupMount, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("cgroup2", memCgroupMount, "cgroup2", 0, ""); err != nil {
			t.Fatalf("mounting cgroup2 on %s: %v", memCgroupMount, err)
		}
		t.Cleanup(func() { _ = unix.Unmount(memCgroupMount, unix.MNT_DETACH) })
		root = memCgroupMount
		if c, _ := os.ReadFile(filepath.Join(root, "cgroup.controllers")); !hasWord(string(c), "memory") {
			t.Fatalf("cgroup2 in the VM has no memory controller: %q", c)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "cgroup.subtree_control"), []byte("+memory"), 0o644); err != nil {
		t.Fatalf("enabling the memory controller below %s: %v", root, err)
	}
	dir := filepath.Join(root, "kproxy-test-"+netns.RandomID(4))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// kproxy has stopped; a cgroup is removable once its processes
		// are gone, which the kernel notes a moment after they exit.
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := os.Remove(dir)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("removing cgroup %s: %v", dir, err)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	return dir
}

// memFigures is what the cgroup says about kproxy's memory.
type memFigures struct {
	current, peak                  int64
	anon, file, kernel, sock, slab int64
}

// workingSet is what reclaim cannot take without swap: everything but the
// page cache.
func (m memFigures) workingSet() int64 { return m.current - m.file }

func (m memFigures) String() string {
	return fmt.Sprintf("current=%s peak=%s anon=%s file=%s kernel=%s slab=%s sock=%s",
		mib(m.current), mib(m.peak), mib(m.anon), mib(m.file), mib(m.kernel), mib(m.slab), mib(m.sock))
}

func mib(b int64) string { return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20)) }

func readMem(t *testing.T, cg string) memFigures {
	t.Helper()
	var m memFigures
	m.current = readInt(t, filepath.Join(cg, "memory.current"))
	if _, err := os.Stat(filepath.Join(cg, "memory.peak")); err == nil {
		m.peak = readInt(t, filepath.Join(cg, "memory.peak"))
	}
	st := readKeyed(t, filepath.Join(cg, "memory.stat"))
	m.anon, m.file, m.kernel, m.sock, m.slab = st["anon"], st["file"], st["kernel"], st["sock"], st["slab"]
	return m
}

func readInt(t *testing.T, path string) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return n
}

// readKeyed reads a "key value" per line file (memory.stat, memory.events).
func readKeyed(t *testing.T, path string) map[string]int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	kv := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok {
			kv[k], _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return kv
}

func setMemoryMax(t *testing.T, cg, v string) {
	t.Helper()
	// Writing a limit below the usage makes the kernel reclaim and, when
	// it cannot, OOM-kill in the cgroup before the write returns.
	if err := os.WriteFile(filepath.Join(cg, "memory.max"), []byte(v), 0o644); err != nil {
		t.Fatalf("memory.max = %s: %v", v, err)
	}
}

// eventsDelta formats the memory.events counters that moved.
func eventsDelta(before, after map[string]int64) string {
	var parts []string
	for _, k := range []string{"low", "high", "max", "oom", "oom_kill", "oom_group_kill"} {
		if d := after[k] - before[k]; d != 0 {
			parts = append(parts, fmt.Sprintf("%s+%d", k, d))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}

func testMemoryPressure(t *testing.T, m proxyMode) {
	cg := newMemoryCgroup(t)
	snap := exampleSnapshot(t)
	addServicesFrom(t, snap, 0, memServices)
	f := &faultEnv{t: t, m: m, dir: t.TempDir(), cgroup: cg, snap: snap,
		args: []string{"--iptables-sync-period", memSyncPeriod.String()}}
	f.start()
	p := f.c.kproxy[nodeA]
	// The figure is taken at rest, after the first full sync.
	time.Sleep(5 * time.Second)
	base := readMem(t, cg)
	t.Logf("memory: at rest with %d services: %v working set=%s", memServices+15, base, mib(base.workingSet()))

	// slack is what may pass, beyond the health timeout, before /healthz
	// must say a change kproxy has read is not programmed: the poller
	// asks every 200 ms (1 s timeout), and reading the log takes a poll.
	slack := 2 * time.Second
	if vm.InVM() {
		slack = 5 * time.Second
	}
	reread := regexp.MustCompile(`Reread object files.*changes=[1-9]`)
	var lastRepair time.Duration
	next := memServices
	for _, stage := range []struct {
		name  string
		limit func(memFigures) int64
	}{
		// Room for the page cache kproxy uses is taken away: its
		// executable's pages are reclaimed and read again.
		{"1.2x the working set (memory.current - page cache)", func(m memFigures) int64 { return m.workingSet() * 12 / 10 }},
		// Below what reclaim cannot take without swap.
		{"0.8x the anonymous and kernel memory", func(m memFigures) int64 { return (m.anon + m.kernel) * 8 / 10 }},
	} {
		before := readMem(t, cg)
		ws := before.workingSet()
		limit := stage.limit(before) &^ 4095
		ev0 := readKeyed(t, filepath.Join(cg, "memory.events"))
		on := f.w.mark(stage.name)
		setMemoryMax(t, cg, strconv.FormatInt(limit, 10))
		afterLimit := readMem(t, cg)
		killedAtLimit := readKeyed(t, filepath.Join(cg, "memory.events"))["oom_kill"] > ev0["oom_kill"]

		from := next
		next += memStep
		logOff := len(p.Log())
		addServicesFrom(t, snap, from, memStep)
		f.c.apply(snap)
		changed := time.Now()
		lastVIP := genVIP(next - 1)
		applied := func() bool {
			r := f.c.Pod(t, testerA).NS.Request("tcp", ap(lastVIP+":80"), netns.DialOptions{Timeout: 300 * time.Millisecond})
			return r.Outcome == netns.Answered
		}

		// Under the limit: applied, or kproxy killed, or neither for
		// the whole watch (a sync that cannot complete).
		watch := memHealthTimeout + slack + 15*time.Second
		if vm.InVM() {
			watch += 45 * time.Second
		}
		var appliedAt, readAt time.Time
		deadline := changed.Add(watch)
		for time.Now().Before(deadline) {
			if readAt.IsZero() && reread.MatchString(p.Log()[logOff:]) {
				readAt = time.Now()
			}
			if applied() {
				appliedAt = time.Now()
				break
			}
			if done, _ := p.Exited(); done {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		dead, _ := p.Exited()
		deadSeen := time.Now()
		under := readMem(t, cg)
		ev1 := readKeyed(t, filepath.Join(cg, "memory.events"))
		outcome := "programmed under the limit"
		switch {
		case killedAtLimit:
			outcome = "OOM-killed when the limit was written"
		case dead:
			outcome = "killed after the change"
		case appliedAt.IsZero() && readAt.IsZero():
			outcome = fmt.Sprintf("alive, the change not even read after %v", watch)
		case appliedAt.IsZero():
			outcome = fmt.Sprintf("alive, the change read but not programmed after %v", watch)
		}
		took, read := "-", "-"
		if !appliedAt.IsZero() {
			took = appliedAt.Sub(changed).Round(10 * time.Millisecond).String()
		}
		if !readAt.IsZero() {
			read = readAt.Sub(changed).Round(10 * time.Millisecond).String()
		}
		t.Logf("memory: stage=%q working set=%s (anon+kernel %s) limit=%s; after writing it: %v; outcome=%q read after=%s programmed after=%s; events=%s; at the end of the watch: %v; healthz=%s",
			stage.name, mib(ws), mib(before.anon+before.kernel), mib(limit), afterLimit, outcome, read, took, eventsDelta(ev0, ev1), under, f.w.healthSince(on))
		if dead && ev1["oom_kill"] == ev0["oom_kill"] {
			t.Errorf("%s: kproxy exited without an OOM kill in its cgroup:\n%s", stage.name, p.Tail(20))
		}
		// /healthz told the truth: no 200 once kproxy had held the change
		// unprogrammed for longer than the health timeout, until it was
		// programmed (or the limit lifted, below). A change not read yet
		// is not pending for kproxy (upstream's rule too).
		if !readAt.IsZero() {
			end := appliedAt
			if end.IsZero() {
				end = time.Now()
			}
			f.w.healthNotOK(stage.name, readAt.Add(memHealthTimeout+slack), end)
		}

		lift := f.w.mark("lifted")
		setMemoryMax(t, cg, "max")
		if dead {
			if h := f.w.healthPolledAfter(deadSeen); h.code != 0 {
				t.Errorf("%s: /healthz answered %d with kproxy dead", stage.name, h.code)
			}
			// A supervisor restarts it.
			if err := p.Restart(f.c.Nodes[nodeA].NS, f.c.kproxyArgs(nodeA)...); err != nil {
				t.Fatal(err)
			}
			f.w.mark("restarted")
		}
		if appliedAt.IsZero() {
			netns.Eventually(t, 3*time.Minute, stage.name+": the change programmed after the limit was lifted", func() (bool, string) {
				return applied(), lastVIP + " not answered"
			})
			lastRepair = time.Since(lift)
			t.Logf("memory: stage=%q repaired %v after the limit was lifted", stage.name, lastRepair.Round(10*time.Millisecond))
		}
		f.c.waitSynced(nodeA)
		f.w.waitHealth(stage.name+": repaired", 200, lift, syncTimeout)
		f.c.run(t, probe{from: client, network: "tcp", dst: genVIP(from) + ":80", n: 3, servers: web})
		f.w.mark("repaired")
	}
	f.w.finish("memory pressure/"+m.name, false, lastRepair)
}

// healthNotOK fails if /healthz answered 200 at any moment between from
// and to: the answer in force at from (the latest before it) or any later
// one before to.
func (w *faultWatch) healthNotOK(what string, from, to time.Time) {
	w.t.Helper()
	if !from.Before(to) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var inForce *healthObs
	for i := range w.health {
		h := &w.health[i]
		if !h.at.After(from) {
			inForce = h
			continue
		}
		if h.at.Before(to) && h.code == 200 {
			w.t.Errorf("%s: /healthz answered 200 at %v while the change was not programmed (since %v)",
				what, h.at.Sub(w.start).Round(10*time.Millisecond), from.Sub(w.start).Round(10*time.Millisecond))
		}
	}
	if inForce != nil && inForce.code == 200 {
		w.t.Errorf("%s: /healthz kept answering 200 from %v while the change was not programmed (until %v)",
			what, from.Sub(w.start).Round(10*time.Millisecond), to.Sub(w.start).Round(10*time.Millisecond))
	}
}

// healthSince formats the /healthz answers seen since t0.
func (w *faultWatch) healthSince(t0 time.Time) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var hs []string
	for _, h := range w.health {
		if !h.at.Before(t0) {
			hs = append(hs, fmt.Sprintf("%d@%v", h.code, h.at.Sub(w.start).Round(100*time.Millisecond)))
		}
	}
	return strings.Join(hs, ",")
}
