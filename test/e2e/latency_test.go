package e2e

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/kproxy/kproxy/internal/testutil/netns"
)

const (
	// latencyChanges is how many endpoint changes the latency scenario
	// measures.
	latencyChanges = 20
	// latencyMinSync is the minimum sync interval kproxy runs with in the
	// latency scenario (default 1 s); see scenarioLatency.
	latencyMinSync = 100 * time.Millisecond
	// programmingSlack bounds how far kproxy's figure may be from the
	// test's own. kproxy takes its "rules applied" time when the sync
	// returns: after the nftables commit has returned, which waits for
	// RCU grace periods that can take a few hundred milliseconds on a
	// loaded machine, while packets already follow the new rules. The
	// test's own figure polls every 2 ms and includes one connection.
	programmingSlack = time.Second
	// npSeries is the primary family's series of the programming latency
	// histogram. Each family's proxier observes every change once.
	npSeries = `kubeproxy_network_programming_duration_seconds`
	npLabels = `{ip_family="IPv4"}`
)

func latencyArgs(mode modeCase) []string {
	return []string{mode.minSyncFlag + "=" + latencyMinSync.String()}
}

// scenarioLatency measures network programming latency on real changes.
// Each change gives one of latencyChanges Services, created without
// endpoints (so rejected), its first endpoint; the EndpointSlice write
// carries the trigger-time annotation, set to the time of the write.
// kproxy's kubeproxy_network_programming_duration_seconds must count each
// change once, with a plausible value close to what the test sees itself:
// the time from the API write until a new connection is answered by the
// endpoint.
//
// Each sample is meant to be the latency of the pipeline (watch, change
// tracking, render, apply), not of the rate limiter: before each change
// the test lets the minimum sync interval pass since kproxy's last sync, so
// the change is synced as soon as it arrives. That interval is lowered to
// latencyMinSync here, or 20 samples would take 20 s at the default 1 s; a
// change that arrives less than the interval after the last sync waits up
// to that long on top. Giving a Service its first endpoint removes no
// chain, so no clean-up sync follows a change (a removed endpoint's chain
// is deleted in a second sync about 1 s later).
func scenarioLatency(e *env) {
	t := e.t
	pods := []string{podA1, podA2, podB1}
	type target struct {
		name string
		dst  netip.AddrPort
		pod  string
	}
	var targets []target
	for i := range latencyChanges {
		name := fmt.Sprintf("lat-%02d", i)
		svc := e.createService(name)
		e.setEndpoints(name, ipv4)
		targets = append(targets, target{name: name, dst: ap(clusterIP(svc, v4), 80), pod: pods[i%len(pods)]})
	}
	for _, tg := range targets {
		e.expectOutcome(client, "tcp", tg.dst, netns.Refused)
	}

	histogram := func() (count, sum float64) {
		t.Helper()
		m, err := e.metrics()
		if err != nil {
			t.Fatal(err)
		}
		count, ok := metricValue(m, npSeries+"_count"+npLabels)
		if !ok {
			t.Fatalf("/metrics has no %s_count%s", npSeries, npLabels)
		}
		sum, _ = metricValue(m, npSeries+"_sum"+npLabels)
		return count, sum
	}
	// The setup's EndpointSlice writes carry trigger times too, and a
	// Service without endpoints is refused before its slice has even
	// arrived, so the refusals above do not prove that those trigger times
	// have been observed. Start counting once the histogram holds still
	// across an idle sync interval.
	startCount, _ := histogram()
	for i := 0; ; i++ {
		e.waitSyncIdle(latencyMinSync)
		time.Sleep(300 * time.Millisecond)
		e.waitSyncIdle(latencyMinSync)
		c, _ := histogram()
		if c == startCount {
			break
		}
		if i == 20 {
			t.Fatalf("%s_count%s kept growing before any change was made: %v, then %v", npSeries, npLabels, startCount, c)
		}
		startCount = c
	}

	var metric, seen []time.Duration
	for i, tg := range targets {
		dst := tg.dst
		e.waitSyncIdle(latencyMinSync)
		count0, sum0 := histogram()

		trigger := e.setEndpoints(tg.name, ipv4, endpoint{pod: tg.pod})
		deadline := trigger.Add(waitTimeout)
		for {
			r := request(e.c.Client, "tcp", dst)
			if r.Outcome == netns.Answered && r.Server == tg.pod {
				break
			}
			if r.Outcome != netns.Refused || time.Now().After(deadline) {
				e.alive()
				t.Fatalf("change %d: %s from the client: %v; want refused until %s answers (within %s)", i, dst, r, tg.pod, waitTimeout)
			}
			time.Sleep(2 * time.Millisecond)
		}
		took := time.Since(trigger)

		var v time.Duration
		e.eventually(fmt.Sprintf("change %d observed in %s", i, npSeries), func() error {
			count, sum := histogram()
			switch {
			case count == count0:
				return fmt.Errorf("%s_count still %v", npSeries, count)
			case count != count0+1:
				t.Fatalf("change %d: %s_count went from %v to %v, want one observation", i, npSeries, count0, count)
			}
			v = time.Duration((sum - sum0) * float64(time.Second))
			return nil
		})
		if v <= 0 || v >= 10*time.Second {
			t.Errorf("change %d: network programming latency %s, want within (0, 10s)", i, v)
		}
		if v > took+programmingSlack || took > v+programmingSlack {
			t.Errorf("change %d: kproxy reports %s from the trigger time to rules applied, but traffic reached the new endpoint %s after the write", i, v, took)
		}
		metric = append(metric, v)
		seen = append(seen, took)
	}
	if end, _ := histogram(); end-startCount != latencyChanges {
		t.Errorf("%s_count%s grew by %v over %d changes", npSeries, npLabels, end-startCount, latencyChanges)
	}
	round := func(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
	t.Logf("network programming latency (%s): n=%d p50=%s p99=%s (kubeproxy_network_programming_duration_seconds, trigger time to rules applied); "+
		"API write to traffic at the new endpoint: p50=%s p99=%s; changes made with the last sync more than the minimum sync interval (%s) ago",
		e.mode.name, len(metric), round(percentile(metric, 0.5)), round(percentile(metric, 0.99)),
		round(percentile(seen, 0.5)), round(percentile(seen, 0.99)), latencyMinSync)
}

// waitSyncIdle waits until kproxy's last sync (of either family) is more
// than minSync ago, so that the next change is synced at once.
func (e *env) waitSyncIdle(minSync time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		e.alive()
		var last time.Time
		for _, f := range []string{"IPv4", "IPv6"} {
			t, err := e.lastSync(f)
			if err != nil {
				e.t.Fatal(err)
			}
			if t.After(last) {
				last = t
			}
		}
		wait := minSync + 20*time.Millisecond - time.Since(last)
		if wait <= 0 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("kproxy kept syncing for %s (last sync at %s)", waitTimeout, last.Format(time.RFC3339Nano))
		}
		time.Sleep(wait)
	}
}
