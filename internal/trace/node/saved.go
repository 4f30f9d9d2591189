package node

import (
	"fmt"
	"os"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// ReadRules reads and joins the --rules files, each ending in a newline.
func ReadRules(paths []string) (string, error) {
	var b strings.Builder
	for _, p := range paths {
		t, err := os.ReadFile(p)
		if err != nil {
			return "", fmt.Errorf("reading %s: %w", p, err)
		}
		b.Write(t)
		if len(t) == 0 || t[len(t)-1] != '\n' {
			b.WriteString("\n")
		}
	}
	return b.String(), nil
}

// FamilySection keeps the section of one family from kproxy render's
// output ("# IPv4: ..." / "# IPv6: ..." headers); other text is whole.
func FamilySection(text string, fam v1.IPFamily) string {
	if !strings.Contains(text, "\n# IPv6:") && !strings.HasPrefix(text, "# IPv6:") {
		return text
	}
	var b strings.Builder
	keep := true
	for _, line := range strings.SplitAfter(text, "\n") {
		if strings.HasPrefix(line, "# IPv4:") || strings.HasPrefix(line, "# IPv6:") {
			keep = strings.HasPrefix(line, "# "+string(fam)+":")
		}
		if keep {
			b.WriteString(line)
		}
	}
	return b.String()
}
