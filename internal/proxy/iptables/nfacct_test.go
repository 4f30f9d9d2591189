package iptables

// nfacct counters: addresses as in flow_test.go (node-a 198.18.0.10, the
// example's services in 198.19.0.0/16); 127.0.0.1 is node-a's loopback.

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/kernel/nfacct"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
	iptrace "github.com/kproxy/kproxy/internal/trace/iptables"
)

const (
	invalidRule      = "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name " + NFAcctInvalidDropped + " -j DROP"
	plainInvalidRule = "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP"
	localhostMatch   = "-d 127.0.0.0/8 --dport "
)

// localhostRules returns the nat KUBE-NODEPORTS rules that count localhost
// node port packets, by node port.
func localhostRules(dump string) map[string]bool {
	out := map[string]bool{}
	for _, l := range strings.Split(dump, "\n") {
		if !strings.HasPrefix(l, "-A KUBE-NODEPORTS ") || !strings.Contains(l, "--nfacct-name "+NFAcctLocalhostNodePorts) {
			continue
		}
		_, rest, ok := strings.Cut(l, localhostMatch)
		if !ok {
			continue
		}
		port, _, _ := strings.Cut(rest, " ")
		out[port] = true
	}
	return out
}

// nodePortsWithEndpoints are the node ports of the state's service ports
// that have endpoints.
func nodePortsWithEndpoints(s *model.State) map[string]bool {
	out := map[string]bool{}
	for n, sp := range s.Services {
		if sp.NodePort != 0 && len(s.Endpoints[n]) > 0 {
			out[strconv.Itoa(int(sp.NodePort))] = true
		}
	}
	return out
}

func TestProxierNFAcct(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)

	t.Run("IPv4 counts INVALID drops and localhost node ports", func(t *testing.T) {
		r := newRig(t, c, model.IPv4, xtables.Legacy, nil)
		acct := &nfacct.Fake{}
		r.setNFAcct(acct)
		r.mustSync(true)
		for _, name := range []string{NFAcctInvalidDropped, NFAcctLocalhostNodePorts} {
			if _, err := acct.Get(name); err != nil {
				t.Errorf("counter %s: %v", name, err)
			}
		}
		dump := r.fake.Dump()
		if !strings.Contains(dump, invalidRule+"\n") {
			t.Errorf("no counting INVALID drop %q in\n%s", invalidRule, dump)
		}
		want := nodePortsWithEndpoints(r.state)
		if len(want) == 0 {
			t.Fatal("the example has no node port with endpoints")
		}
		if got := localhostRules(dump); !mapsEqual(got, want) {
			t.Errorf("localhost node port counting rules for %v, want one for each node port with endpoints %v", got, want)
		}

		// The counting rule leads where the rule for every address
		// does: a packet from the node to 127.0.0.1:NP reaches the same
		// endpoints with and without the counters.
		plain := newRig(t, c, model.IPv4, xtables.Legacy, nil)
		plain.mustSync(true)
		counted, err := iptrace.Parse([]byte(dump))
		if err != nil {
			t.Fatal(err)
		}
		uncounted, err := iptrace.Parse([]byte(plain.fake.Dump()))
		if err != nil {
			t.Fatal(err)
		}
		counted.RouteLocalnet, uncounted.RouteLocalnet = true, true
		for np := range want {
			p := flowtest.Case{Src: "127.0.0.1", Dst: "127.0.0.1:" + np}.Packet()
			g, err1 := counted.Trace(p, hostA)
			w, err2 := uncounted.Trace(p, hostA)
			if err1 != nil || err2 != nil {
				t.Fatalf("trace %s: %v / %v", p, err1, err2)
			}
			go1, gm, _ := flowtest.Summary(g)
			wo, wm, _ := flowtest.Summary(w)
			if go1 != wo || gm != wm || go1 == "" {
				t.Errorf("%s goes to %q (masquerade %v) with the counter, %q (%v) without", p, go1, gm, wo, wm)
			}
		}

		// A partial sync keeps counting a changed node port service.
		for n, sp := range r.state.Services {
			if sp.NodePort != 0 && len(r.state.Endpoints[n]) > 0 {
				eps := r.state.Endpoints[n]
				r.set(n, sp, eps[:1])
				r.mustSync(false)
				r.set(n, sp, eps)
				r.mustSync(false)
			}
		}
		if got := localhostRules(r.fake.Dump()); !mapsEqual(got, want) {
			t.Errorf("after partial syncs: counting rules for %v, want %v", got, want)
		}
	})

	t.Run("IPv6 has no localhost node ports", func(t *testing.T) {
		r := newRig(t, c, model.IPv6, xtables.Legacy, nil)
		r.setNFAcct(&nfacct.Fake{})
		r.mustSync(true)
		dump := r.fake.Dump()
		if !strings.Contains(dump, invalidRule+"\n") {
			t.Errorf("no counting INVALID drop in IPv6")
		}
		if got := localhostRules(dump); len(got) != 0 {
			t.Errorf("IPv6 counts localhost node ports: %v", got)
		}
	})

	t.Run("liberal conntrack and localhost node ports off: no counter", func(t *testing.T) {
		r := newRig(t, c, model.IPv4, xtables.Legacy, func(o *Options) {
			o.ConntrackTCPBeLiberal, o.LocalhostNodePorts = true, false
		})
		acct := &nfacct.Fake{}
		r.setNFAcct(acct)
		r.mustSync(true)
		if len(acct.Counters) != 0 {
			t.Errorf("counters created for rules that are not written: %v", acct.Counters)
		}
		if dump := r.fake.Dump(); strings.Contains(dump, "nfacct") {
			t.Errorf("nfacct in the rules:\n%s", dump)
		}
	})

	t.Run("a counter that cannot be created leaves the rules uncounted", func(t *testing.T) {
		r := newRig(t, c, model.IPv4, xtables.Legacy, nil)
		r.setNFAcct(&nfacct.Fake{EnsureErr: errors.New("nfnetlink: operation not supported")})
		r.mustSync(true)
		dump := r.fake.Dump()
		if strings.Contains(dump, "nfacct") || !strings.Contains(dump, plainInvalidRule+"\n") {
			t.Errorf("want the plain INVALID drop and no nfacct match:\n%s", dump)
		}
	})

	t.Run("reader", func(t *testing.T) {
		acct := &nfacct.Fake{}
		read := NFAcctReader(acct, NFAcctInvalidDropped)
		if got, err := read(context.Background()); err != nil || len(got) != 0 {
			t.Errorf("before the counter exists: %v, %v; want no sample", got, err)
		}
		if err := acct.Ensure(NFAcctInvalidDropped); err != nil {
			t.Fatal(err)
		}
		acct.Counters[NFAcctInvalidDropped].Packets = 7
		if got, err := read(context.Background()); err != nil || len(got) != 1 || got[0].Packets != 7 || len(got[0].LabelValues) != 0 {
			t.Errorf("read %+v, %v; want one unlabelled sample of 7", got, err)
		}
	})
}

func mapsEqual(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}
