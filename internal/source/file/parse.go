// Package file is the source that reads Kubernetes objects from files, as
// `kubectl get svc,endpointslices,nodes -A -o yaml` (or -o json) writes them,
// and watches the files for changes. It lets kproxy run, render and be tested
// without an API server.
package file

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	yamlv3 "go.yaml.in/yaml/v3"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/internal/model"
)

// Objects are the objects read from files, in the order they were found.
type Objects struct {
	Services       []*v1.Service
	EndpointSlices []*discovery.EndpointSlice
	Nodes          []*v1.Node
}

// Feed delivers every object to h as an update, Nodes first, then Services,
// then EndpointSlices, and then calls h.Synced().
func (o *Objects) Feed(h model.EventHandler) {
	for _, n := range o.Nodes {
		h.NodeUpdated(n)
	}
	for _, s := range o.Services {
		h.ServiceUpdated(s)
	}
	for _, s := range o.EndpointSlices {
		h.EndpointSliceUpdated(s)
	}
	h.Synced()
}

// DocumentError says which object of which file could not be used. The
// object was skipped; the rest of the file was still read.
type DocumentError struct {
	// File is the file name as given to Parse or found by Load.
	File string
	// Document is the 1-based index of the YAML document ("---"
	// separated; empty documents are not counted) or JSON value in File.
	Document int
	// Item is the 0-based index in the document's items when the document
	// is a List, else -1.
	Item int
	// Line is the 1-based line where the document or item starts, or
	// where the YAML syntax error is; 0 when unknown.
	Line int
	// Kind, Namespace and Name identify the object, as far as they could
	// be read (empty when not).
	Kind, Namespace, Name string
	Err                   error
}

func (e *DocumentError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		b.WriteString(":" + strconv.Itoa(e.Line))
	}
	b.WriteString(": document " + strconv.Itoa(e.Document))
	if e.Item >= 0 {
		b.WriteString(", items[" + strconv.Itoa(e.Item) + "]")
	}
	if e.Kind != "" || e.Name != "" {
		b.WriteString(": ")
		kind := e.Kind
		if kind == "" {
			kind = "object"
		}
		b.WriteString(kind + " ")
		switch {
		case e.Name == "":
			b.WriteString("(no name)")
		case e.Namespace != "":
			b.WriteString(e.Namespace + "/" + e.Name)
		default:
			b.WriteString(e.Name)
		}
	}
	b.WriteString(": " + e.Err.Error())
	return b.String()
}

func (e *DocumentError) Unwrap() error { return e.Err }

// API versions accepted for each kind. An empty apiVersion is accepted too:
// hand-written files often leave it out.
var apiVersions = map[string]string{
	"Service":       "v1",
	"Node":          "v1",
	"EndpointSlice": discovery.SchemeGroupVersion.String(),
}

// Parse reads the objects in data, the content of the file called name
// (used in errors). data is YAML, possibly several documents separated by
// "---" lines, or JSON, possibly several values one after the other. Each
// document is a single object or a List (kind List or any kind ending in
// "List", with items). Services and Nodes of apiVersion v1 and
// EndpointSlices of discovery.k8s.io/v1 are kept; other kinds are ignored
// (logged at V(2)). Unknown fields are ignored, as kubectl output may carry
// fields newer than our API types.
//
// A document or item that cannot be used (bad YAML or JSON, a field of the
// wrong type, no kind, no name, a duplicate) is skipped and reported as a
// *DocumentError, in the returned list and in the log; everything else is
// kept. Parse reads no file.
func Parse(name string, data []byte) (*Objects, []error) {
	c := newCollector()
	c.parse(name, data)
	return c.objs, c.errs
}

// Load reads path: a file, or a directory of which every *.yaml, *.yml and
// *.json file (not in subdirectories, not hidden: names starting with "."
// are skipped, as editors and ConfigMap volumes keep their own files there)
// is read in name order. Errors are as in Parse, plus one for each file
// that could not be read; an object found twice, in one file or two, is
// kept the first time and reported the second.
func Load(path string) (*Objects, []error) {
	objs, errs, _ := load(path, nil)
	return objs, errs
}

// loadResult says, for a watcher, what load saw besides objects and errors.
type loadResult struct {
	// unreadable is set when path or one of its files could not be read:
	// a file may be in the middle of being replaced.
	unreadable bool
	// empty lists the files that were empty (or held only comments).
	empty []string
	// state has an entry (digest, file, deletion stub) for every object
	// kept.
	state *state
	// objects are the objects kept, by key.
	objects map[objectKey]any
}

// load reads path as Load does. An object whose text is the same as when
// it was put in prev (same key, same digest) is not decoded again: its
// entry is taken from prev, and it is neither in Objects nor in
// loadResult.objects. prev may be nil.
func load(path string, prev *state) (*Objects, []error, loadResult) {
	c := newCollector()
	c.prev = prev
	res := loadResult{state: c.state, objects: c.byKey}
	files, err := filesOf(path)
	if err != nil {
		res.unreadable = true
		c.fail(err)
		return c.objs, c.errs, res
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			res.unreadable = true
			c.fail(err)
			continue
		}
		if isBlank(data) {
			res.empty = append(res.empty, f)
		}
		c.parse(f, data)
	}
	return c.objs, c.errs, res
}

// filesOf returns path if it is a file, or the files Load reads in it if it
// is a directory.
func filesOf(path string) ([]string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return []string{path}, nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, e := range entries {
		if !wantedFile(e.Name()) {
			continue
		}
		full := filepath.Join(path, e.Name())
		// Follow symlinks (ConfigMap volumes are made of them), skip
		// directories and anything that vanished meanwhile.
		if st, err := os.Stat(full); err != nil || !st.Mode().IsRegular() {
			continue
		}
		files = append(files, full)
	}
	return files, nil
}

func wantedFile(name string) bool {
	if strings.HasPrefix(name, ".") {
		return false
	}
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// objectKey identifies an object across files and reloads.
type objectKey struct {
	Kind, Namespace, Name string
}

func (k objectKey) String() string {
	if k.Namespace == "" {
		return k.Kind + " " + k.Name
	}
	return k.Kind + " " + k.Namespace + "/" + k.Name
}

// collector gathers objects and errors across the files of one load.
type collector struct {
	objs  *Objects
	errs  []error
	seen  map[objectKey]string // where each object was first found
	state *state               // an entry for each object kept
	prev  *state               // objects not to decode again, or nil
	byKey map[objectKey]any    // the objects kept
}

func newCollector() *collector {
	return &collector{objs: &Objects{}, seen: map[objectKey]string{}, state: newState(), byKey: map[objectKey]any{}}
}

func (c *collector) fail(err error) {
	klog.ErrorS(err, "Cannot read object file")
	c.errs = append(c.errs, err)
}

func (c *collector) bad(e *DocumentError) {
	klog.ErrorS(e.Err, "Skipping object", "file", e.File, "line", e.Line, "document", e.Document, "item", e.Item,
		"kind", e.Kind, "namespace", e.Namespace, "name", e.Name)
	c.errs = append(c.errs, e)
}

// document is one YAML document or JSON value of a file.
type document struct {
	file  string
	index int    // 1-based
	line  int    // 1-based line of its first content line
	text  []byte // its source text
	json  []byte // its content as JSON
	// itemLines are the start lines of a List's items, computed only when
	// an item has an error (it needs a second parse).
	itemLines []int
	linesDone bool
}

func (c *collector) parse(name string, data []byte) {
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf")) // a UTF-8 byte order mark
	if first := firstNonSpace(data); first == '{' || first == '[' {
		// YAML flow style also starts so: a .yaml file that is not JSON
		// is read as YAML.
		isJSON := strings.EqualFold(filepath.Ext(name), ".json") || json.Valid(data) || !yamlValid(data)
		if isJSON {
			c.parseJSON(name, data)
			return
		}
	}
	index := 0
	for _, chunk := range splitYAML(data) {
		if isBlank(chunk.text) {
			continue
		}
		index++
		doc := &document{file: name, index: index, line: chunk.line + leadingBlankLines(chunk.text), text: chunk.text}
		j, err := yaml.YAMLToJSON(chunk.text)
		if err != nil {
			c.bad(&DocumentError{File: name, Document: index, Item: -1, Line: doc.line, Err: syntaxError(chunk, err)})
			continue
		}
		if string(j) == "null" {
			continue
		}
		doc.json = j
		c.document(doc)
	}
}

func (c *collector) parseJSON(name string, data []byte) {
	dec := json.NewDecoder(bytes.NewReader(data))
	// Lines are counted as the decoder advances, not from the start for
	// each value, so that a long stream is not read over and over.
	line, counted := 1, int64(0)
	for index := 1; ; index++ {
		start := dec.InputOffset()
		line += bytes.Count(data[counted:start], []byte("\n"))
		counted = start
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if err == io.EOF {
			return
		}
		// The value starts after the blank lines that precede it.
		line := line + leadingBlankLines(data[start:])
		if err != nil {
			// A JSON stream cannot be resynchronized after a syntax
			// error: the rest of the file is lost.
			c.bad(&DocumentError{File: name, Document: index, Item: -1, Line: line, Err: fmt.Errorf("invalid JSON, rest of the file skipped: %w", err)})
			return
		}
		c.document(&document{file: name, index: index, line: line, text: data[start:dec.InputOffset()], json: raw})
	}
}

// header is what is read of every object before decoding it into its type;
// each part is decoded on its own so that one bad field does not hide the
// others (an error message should still name the object).
type header struct {
	APIVersion, Kind, Namespace, Name string
	Items                             []json.RawMessage
	IsList                            bool
}

func readHeader(raw []byte) (header, error) {
	var h header
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		return h, errors.New("not an object (a YAML mapping or JSON object)")
	}
	_ = json.Unmarshal(top["apiVersion"], &h.APIVersion)
	_ = json.Unmarshal(top["kind"], &h.Kind)
	var meta map[string]json.RawMessage
	if json.Unmarshal(top["metadata"], &meta) == nil {
		_ = json.Unmarshal(meta["name"], &h.Name)
		_ = json.Unmarshal(meta["namespace"], &h.Namespace)
	}
	if items, ok := top["items"]; ok && strings.HasSuffix(h.Kind, "List") {
		h.IsList = true
		if string(items) != "null" {
			if err := json.Unmarshal(items, &h.Items); err != nil {
				return h, errors.New("items is not a list")
			}
		}
	}
	return h, nil
}

func (c *collector) document(doc *document) {
	h, err := readHeader(doc.json)
	if err != nil {
		c.bad(&DocumentError{File: doc.file, Document: doc.index, Item: -1, Line: doc.line, Kind: h.Kind, Name: h.Name, Err: err})
		return
	}
	if !h.IsList {
		c.object(doc, -1, doc.json)
		return
	}
	for i, item := range h.Items {
		c.object(doc, i, item)
	}
}

func (c *collector) object(doc *document, item int, raw []byte) {
	pos := fmt.Sprintf("%s: document %d", doc.file, doc.index)
	if item >= 0 {
		pos += fmt.Sprintf(", items[%d]", item)
	}
	fail := func(h header, err error) {
		line := doc.line
		if item >= 0 {
			line = doc.itemLine(item)
		}
		c.bad(&DocumentError{File: doc.file, Document: doc.index, Item: item, Line: line, Kind: h.Kind, Namespace: h.Namespace, Name: h.Name, Err: err})
	}
	h, err := readHeader(raw)
	if err != nil {
		fail(h, err)
		return
	}
	if h.Kind == "" {
		fail(h, errors.New("no kind"))
		return
	}
	want, known := apiVersions[h.Kind]
	if !known {
		klog.V(2).InfoS("Ignoring object of a kind not used", "position", pos, "apiVersion", h.APIVersion, "kind", h.Kind, "namespace", h.Namespace, "name", h.Name)
		return
	}
	if h.APIVersion != "" && h.APIVersion != want {
		fail(h, fmt.Errorf("apiVersion %q not supported for %s, want %q", h.APIVersion, h.Kind, want))
		return
	}
	if h.Name == "" {
		fail(h, errors.New("no metadata.name"))
		return
	}
	// The digest is of the object's text as read (for YAML, as converted
	// to JSON), not of the decoded object: see state.
	sum := sha256.Sum256(raw)
	if c.prev != nil {
		// Decoding is most of the cost of a reread and makes garbage
		// of the size of the whole snapshot. Text that decoded before
		// decodes the same way again, so an unchanged object can be
		// kept as it is, as long as the key is computed as below.
		key := objectKey{Kind: h.Kind, Namespace: h.Namespace, Name: h.Name}
		if h.Kind == "Node" {
			key.Namespace = ""
		} else if key.Namespace == "" {
			key.Namespace = v1.NamespaceDefault
		}
		if old, ok := c.prev.of(h.Kind)[key]; ok && old.sum == sum {
			if first, dup := c.seen[key]; dup {
				fail(h, fmt.Errorf("duplicate %s, already read at %s", key, first))
				return
			}
			c.seen[key] = pos
			old.file = doc.file
			c.state.of(h.Kind)[key] = old
			return
		}
	}
	var obj interface {
		GetNamespace() string
		SetNamespace(string)
	}
	switch h.Kind {
	case "Service":
		obj = &v1.Service{}
	case "Node":
		obj = &v1.Node{}
	case "EndpointSlice":
		obj = &discovery.EndpointSlice{}
	}
	if err := json.Unmarshal(raw, obj); err != nil {
		fail(h, err)
		return
	}
	// kubectl's convention for namespaced objects written without one.
	if h.Kind == "Node" {
		obj.SetNamespace("")
	} else if obj.GetNamespace() == "" {
		obj.SetNamespace(v1.NamespaceDefault)
	}
	key := objectKey{Kind: h.Kind, Namespace: obj.GetNamespace(), Name: h.Name}
	if first, dup := c.seen[key]; dup {
		fail(h, fmt.Errorf("duplicate %s, already read at %s", key, first))
		return
	}
	c.seen[key] = pos
	c.byKey[key] = obj
	e := entry{sum: sum, file: doc.file}
	switch o := obj.(type) {
	case *v1.Service:
		c.objs.Services = append(c.objs.Services, o)
		c.state.services[key] = e
	case *v1.Node:
		c.objs.Nodes = append(c.objs.Nodes, o)
		c.state.nodes[key] = e
	case *discovery.EndpointSlice:
		c.objs.EndpointSlices = append(c.objs.EndpointSlices, o)
		e.addressType = o.AddressType
		e.service, e.hasService = o.Labels[discovery.LabelServiceName]
		c.state.slices[key] = e
	}
}

// itemLine returns the line where items[i] starts, parsing the document a
// second time (keeping line numbers) the first time it is needed.
func (d *document) itemLine(i int) int {
	if !d.linesDone {
		d.linesDone = true
		var root yamlv3.Node
		if yamlv3.Unmarshal(d.text, &root) == nil && root.Kind == yamlv3.DocumentNode && len(root.Content) == 1 {
			m := root.Content[0]
			for k := 0; m.Kind == yamlv3.MappingNode && k+1 < len(m.Content); k += 2 {
				if m.Content[k].Value == "items" && m.Content[k+1].Kind == yamlv3.SequenceNode {
					for _, it := range m.Content[k+1].Content {
						d.itemLines = append(d.itemLines, it.Line)
					}
				}
			}
		}
	}
	if i < len(d.itemLines) {
		// The second parse saw the document alone: shift to file lines.
		return d.itemLines[i] + d.line - 1 - leadingBlankLines(d.text)
	}
	return d.line
}

// chunk is a YAML document's text and the line it starts on.
type chunk struct {
	text []byte
	line int
}

// splitYAML cuts a YAML stream at "---" lines and at "..." document end
// lines. Splitting ourselves, rather than letting a YAML decoder walk the
// stream, lets a document with a syntax error be skipped while the ones
// after it are still read.
func splitYAML(data []byte) []chunk {
	var out []chunk
	start, startLine := 0, 1
	line := 1
	for pos := 0; pos < len(data); line++ {
		next := len(data)
		if end := bytes.IndexByte(data[pos:], '\n'); end >= 0 {
			next = pos + end + 1
		}
		l := bytes.TrimRight(data[pos:next], " \t\r\n")
		switch {
		case bytes.Equal(l, []byte("---")) || bytes.HasPrefix(l, []byte("--- ")) || bytes.HasPrefix(l, []byte("---\t")):
			out = append(out, chunk{text: data[start:pos], line: startLine})
			// What follows the marker on its line ("--- |", "--- {...}")
			// starts the next document.
			start, startLine = pos+3, line
		case bytes.Equal(l, []byte("...")):
			out = append(out, chunk{text: data[start:pos], line: startLine})
			start, startLine = next, line+1
		}
		pos = next
	}
	return append(out, chunk{text: data[start:], line: startLine})
}

// syntaxError makes a YAML parser error name file lines, not lines of the
// document alone: the document is parsed again after as many empty lines
// as precede it (only on this error path, as it costs memory).
func syntaxError(c chunk, err error) error {
	padded := append(bytes.Repeat([]byte("\n"), c.line-1), c.text...)
	if _, err2 := yaml.YAMLToJSON(padded); err2 != nil {
		err = err2
	}
	return fmt.Errorf("invalid YAML: %w", err)
}

// isBlank reports whether YAML text holds only blank lines and comments.
func isBlank(text []byte) bool {
	for l := range bytes.Lines(text) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			return false
		}
	}
	return true
}

// leadingBlankLines counts the blank and comment lines before the content.
func leadingBlankLines(text []byte) int {
	n := 0
	for l := range bytes.Lines(text) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			return n
		}
		n++
	}
	return n
}

func yamlValid(data []byte) bool {
	_, err := yaml.YAMLToJSON(data)
	return err == nil
}

func firstNonSpace(data []byte) byte {
	t := bytes.TrimLeft(data, " \t\r\n")
	if len(t) == 0 {
		return 0
	}
	return t[0]
}

// sortedKeys returns a map's keys in order, for deterministic delivery.
func sortedKeys[V any](m map[objectKey]V) []objectKey {
	keys := make([]objectKey, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b objectKey) int { return strings.Compare(a.String(), b.String()) })
	return keys
}
