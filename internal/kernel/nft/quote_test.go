package nft

import "testing"

func TestQuotesAsIs(t *testing.T) {
	for _, s := range []string{"", "ns/svc:http", "a b", "ü 日本", "tab\there", `q"uote`, `back\slash`, "bad\xffutf8", "nl\n", "\u00a0nbsp", "\u200bzw", "\U0001F600", "\uFFFD"} {
		want := quote(s) == `"`+s+`"`
		if got := quotesAsIs(s); got != want {
			t.Errorf("quotesAsIs(%q) = %v, want %v", s, got, want)
		}
	}
}
