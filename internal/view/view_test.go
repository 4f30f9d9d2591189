package view

// Address plan: 198.18.0.0/16 pods, 198.19.0.0/16 service IPs.

import (
	"strings"
	"testing"
)

func TestTableColumnsAndNotes(t *testing.T) {
	s := &Snapshot{Node: "node-a", Families: []FamilyView{{Family: "IPv4", Services: []ServiceView{
		{Name: "ns/a:http/TCP", Type: "LoadBalancer", ClusterIP: "198.19.0.1", Port: 80, Protocol: "TCP",
			NodePort: 30080, LoadBalancerVIPs: []string{"198.19.200.1", "198.19.200.2"},
			InternalTrafficPolicy: "Local", Cluster: []string{"198.18.1.1:80"}, Verdict: "load-balance over 1 endpoint(s)",
			Excluded: []ExcludedView{{Endpoint: "198.18.2.2:80", Reason: "a reason far longer than any column of this table"}}},
		{Name: "ns/bb:http/TCP", Type: "ClusterIP", ClusterIP: "198.19.0.2", Port: 80, Protocol: "TCP", Verdict: "reject: no endpoints"},
	}}}}

	var b strings.Builder
	if err := WriteTable(&b, s); err != nil {
		t.Fatal(err)
	}
	want := `# node node-a

## IPv4
SERVICE PORT    TYPE          ADDRESSES                  VERDICT
ns/a:http/TCP   LoadBalancer  198.19.0.1:80/tcp +3 more  load-balance over 1 endpoint(s)
    - 198.18.2.2:80 left out: a reason far longer than any column of this table
ns/bb:http/TCP  ClusterIP     198.19.0.2:80/tcp          reject: no endpoints
`
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}

	b.Reset()
	if err := WriteWideTable(&b, s); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"198.19.0.1:80/tcp nodePort 30080 lb 198.19.200.1 lb 198.19.200.2", "int=Local", "cluster: 198.18.1.1:80"} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("wide table lacks %q:\n%s", w, b.String())
		}
	}
}
