package safetext

import (
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

// Names below are hostile on purpose: what a Service may carry when it
// does not come through API validation (the file source).

func TestCommentUnchangedWhenSafe(t *testing.T) {
	for _, s := range []string{
		"",
		"ns/name:http/TCP",
		"kube-system/kube-dns:dns-tcp cluster IP",
		"kubernetes service nodeports; NOTE: this must be the last rule in this chain",
		strings.Repeat("a", NFTComment),
		"it's {fine} #1 $x;",
	} {
		if got := Comment(s, NFTComment); got != s {
			t.Errorf("Comment(%q) = %q, want it unchanged", s, got)
		}
	}
}

func TestCommentHostile(t *testing.T) {
	long63 := strings.Repeat("n", 63)
	for _, tc := range []struct {
		name, in string
		max      int
		prefix   string // the readable part expected before "~hash"
	}{
		{"63/63/15 nftables", long63 + "/" + strings.Repeat("s", 63) + ":" + strings.Repeat("p", 15) + "/TCP", NFTComment, long63 + "/" + strings.Repeat("s", 53)},
		{"1000 characters iptables", strings.Repeat("x", 1000), IPTablesComment, strings.Repeat("x", IPTablesComment-hashLen-1)},
		{"quote and injection", "ns/web:a\"\n-I KUBE-SERVICES 1 -j ACCEPT", IPTablesComment, "ns/web:a__-I KUBE-SERVICES 1 -j ACCEPT"},
		{"restore commands", "x\nCOMMIT\n*filter\n-I INPUT 1 -j ACCEPT\n", IPTablesComment, "x_COMMIT_*filter_-I INPUT 1 -j ACCEPT_"},
		{"backslash", `a\b`, NFTComment, "a_b"},
		{"control characters", "a\x00b\x1bc\td\x7f", NFTComment, "a_b_c_d_"},
		{"non-ASCII runes become one _", "café/日本", NFTComment, "caf_/__"},
		{"invalid UTF-8", "a\xff\xfeb", NFTComment, "a__b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Comment(tc.in, tc.max)
			if !IsComment(got, tc.max) {
				t.Fatalf("Comment(%q) = %q: not safe within %d bytes", tc.in, got, tc.max)
			}
			want := tc.prefix + "~" + hash(tc.in)
			if got != want {
				t.Errorf("Comment(%q) =\n %q, want\n %q", tc.in, got, want)
			}
			if again := Comment(got, tc.max); again != got {
				t.Errorf("not idempotent: %q then %q", got, again)
			}
		})
	}
}

func TestCommentLimits(t *testing.T) {
	for _, max := range []int{NFTComment, IPTablesComment, 12, 11, 5} {
		for n := 0; n < 3*max; n += 7 {
			for _, c := range []string{"a", "é", "\"", "\n"} {
				s := strings.Repeat(c, n)
				got := Comment(s, max)
				if len(got) > max || !IsComment(got, max) {
					t.Fatalf("Comment(%d×%q, %d) = %q (%d bytes)", n, c, max, got, len(got))
				}
			}
		}
	}
}

// Two texts that differ only past the cut, or only in characters that are
// replaced, must not end up as the same comment.
func TestCommentUnique(t *testing.T) {
	base := strings.Repeat("a", 300)
	seen := map[string]string{}
	add := func(s string) {
		c := Comment(s, NFTComment)
		if other, ok := seen[c]; ok && other != s {
			t.Fatalf("%q and %q both give %q", other, s, c)
		}
		seen[c] = s
	}
	for i := 0; i < 200; i++ {
		add(base + string(rune('a'+i%26)) + strings.Repeat("z", i/26))
	}
	for _, s := range []string{"a\"b", "a\nb", "a b", "a_b", "a\\b", "aéb", "a\x00b"} {
		add(s)
	}
}

func TestName(t *testing.T) {
	for in, want := range map[string]string{
		"ns/name/tcp/http":          "ns/name/tcp/http",
		"Ns.x/a_b-c":                "Ns.x/a_b-c",
		"ns/we b\"x\n/tcp/é":        "ns/we_b_x_/tcp/_",
		"a:b;c{d}e#f$g'h@i\\j\x00k": "a_b_c_d_e_f_g_h_i_j_k",
	} {
		if got := Name(in); got != want {
			t.Errorf("Name(%q) = %q, want %q", in, got, want)
		}
	}
}

// The adapters refuse comments past nft.MaxCommentLen: the limit here must
// be the same.
func TestNFTLimitMatchesAdapter(t *testing.T) {
	if NFTComment != nft.MaxCommentLen {
		t.Errorf("NFTComment = %d, the nft adapters allow %d", NFTComment, nft.MaxCommentLen)
	}
	if err := nft.CheckComment(Comment(strings.Repeat("é\"", 200), NFTComment)); err != nil {
		t.Errorf("the nft adapters refuse a safe comment: %v", err)
	}
}
