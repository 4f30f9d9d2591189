package malformed

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/kproxy/kproxy/internal/model"
)

// FileCase is a malformed file, given to kproxy as a file of its own in
// the snapshot directory beside the healthy ones.
type FileCase struct {
	Name string
	// FileName is the file's name in the directory.
	FileName string
	Data     func() []byte
	// Want is FileFault (Reason a file fault reason), or Skip for a
	// file that is read but whose object is skipped (Kind, Reason,
	// Object as in Case).
	Want                 Want
	Kind, Reason, Object string
	// ClusterIP, if set, must be in no rule.
	ClusterIP string
}

// FileSize is the size of the large files: 50 MB.
const FileSize = 50 << 20

// FileCases returns the file-level cases.
func FileCases() []FileCase {
	fault := func(name, file, reason string, data func() []byte) FileCase {
		return FileCase{Name: name, FileName: file, Data: data, Want: FileFault, Reason: reason}
	}
	text := func(s string) func() []byte { return func() []byte { return []byte(s) } }
	return []FileCase{
		{
			Name: "a 50 MB file: one Service whose service-proxy-name label is 50 MB", FileName: "zz-50mb-label.json",
			Want: Skip, Kind: "Service", Reason: model.ReasonLabel, Object: Namespace + "/mc-big", ClusterIP: "198.19.61.200",
			Data: func() []byte {
				s := service(0)
				set(s, "metadata.name", "mc-big")
				set(s, "metadata.labels", obj{"service.kubernetes.io/service-proxy-name": strings.Repeat("x", FileSize)})
				set(s, "spec.clusterIP", "198.19.61.200")
				set(s, "spec.clusterIPs", []any{"198.19.61.200"})
				b, err := json.Marshal(s)
				if err != nil {
					panic(err)
				}
				return b
			},
		},
		fault("a 50 MB file of binary junk", "zz-50mb-junk.yaml", "unparsable", func() []byte {
			b := make([]byte, FileSize)
			for i := range b {
				b[i] = byte(i*7919) | 0x80
			}
			return b
		}),
		fault("an empty file", "zz-empty.yaml", "empty", text("")),
		fault("only comments and document separators", "zz-comments.yaml", "empty", text("# nothing\n---\n---\n# more nothing\n")),
		fault("a top-level object without kind", "zz-nokind.json", "unparsable", text(`{"hello": "world"}`)),
		fault("a top-level scalar", "zz-scalar.yaml", "unparsable", text("just words\n")),
		fault("a List cut short (no kind after the items)", "zz-cut.yaml", "truncated",
			text("apiVersion: v1\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: {name: mc-cut, namespace: mal}\n")),
		fault("YAML with a syntax error", "zz-syntax.yaml", "unparsable", text("kind: Service\nmetadata:\n  name: [unclosed\n")),
		fault("JSON cut in the middle", "zz-cut.json", "unparsable", text(`{"apiVersion": "v1", "kind": "List", "items": [{"kind": "Serv`)),
		fault("a YAML alias bomb", "zz-bomb.yaml", "unparsable", func() []byte {
			var b bytes.Buffer
			b.WriteString("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n")
			for i := 1; i < 10; i++ {
				b.WriteString("a" + string(rune('0'+i)) + ": &a" + string(rune('0'+i)) + " [")
				for j := range 10 {
					if j > 0 {
						b.WriteString(", ")
					}
					b.WriteString("*a" + string(rune('0'+i-1)))
				}
				b.WriteString("]\n")
			}
			return b.Bytes()
		}),
		fault("100,000 nested lists", "zz-nested.yaml", "unparsable", func() []byte {
			return []byte(strings.Repeat("[", 100000) + strings.Repeat("]", 100000))
		}),
		fault("invalid UTF-8", "zz-utf8.yaml", "unparsable", text("kind: Service\nmetadata: {name: \"\xff\xfe\"}\n")),
	}
}
