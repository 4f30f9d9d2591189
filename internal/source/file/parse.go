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
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	yamlv3 "go.yaml.in/yaml/v3"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/klog/v2"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/internal/metrics"
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
	c.logErrors()
	return c.objs, c.errs
}

// Load reads path: a file, or a directory of which every *.yaml, *.yml and
// *.json file (not in subdirectories, not hidden: names starting with "."
// are skipped, as editors and ConfigMap volumes keep their own files there)
// is read in name order. Errors are as in Parse, plus a *FileError for each
// file that cannot be used as a whole (see faults.go): such a file gives
// no object. An object found twice, in one file or two, is kept the first
// time and reported the second.
func Load(path string) (*Objects, []error) {
	st, err := os.Stat(path)
	if err != nil {
		return &Objects{}, []error{statError(path, err)}
	}
	objs, errs, _ := load(path, loadOptions{dir: st.IsDir(), limit: maxFileSize}, nil)
	return objs, errs
}

// loadOptions say how to read a path.
type loadOptions struct {
	// dir is set when path is read as a directory. The watcher fixes it
	// when it starts: a directory where the file was is a fault, not a
	// new kind of source.
	dir bool
	// limit is the largest file accepted, in bytes.
	limit int64
}

// loadResult says, for a watcher, what load saw besides objects and errors.
type loadResult struct {
	// faults are the files that could not be used as a whole; what they
	// gave in prev is in state again, unchanged.
	faults []*FileError
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
//
// A file with a fault gives no object; its entries in prev are kept in
// the result's state as they were (unless another file now has the same
// object), so that comparing prev with the result deletes nothing of it.
// A fault of the path itself (missing, not a directory or file as it was,
// a directory without snapshot files) keeps all of prev.
func load(path string, o loadOptions, prev *state) (*Objects, []error, loadResult) {
	c := newCollector()
	c.prev = prev
	res := loadResult{state: c.state, objects: c.byKey}
	files, fault := filesOf(path, o.dir)
	if fault != nil {
		res.faults = append(res.faults, fault)
		c.errs = append(c.errs, fault)
		res.state = keepAll(prev)
		return c.objs, c.errs, res
	}
	bad := map[string]bool{}
	for _, f := range files {
		data, fault := readFile(f, o.limit)
		if fault == nil {
			fault = c.parseFile(f, data)
		}
		if fault != nil {
			bad[f] = true
			res.faults = append(res.faults, fault)
			c.errs = append(c.errs, fault)
		}
	}
	if prev != nil && len(bad) > 0 {
		for _, kind := range []string{"Node", "Service", "EndpointSlice"} {
			for k, e := range prev.of(kind) {
				if _, now := c.state.of(kind)[k]; bad[e.file] && !now {
					c.state.of(kind)[k] = e
				}
			}
		}
	}
	return c.objs, c.errs, res
}

// keepAll returns a copy of prev (an empty state if nil).
func keepAll(prev *state) *state {
	s := newState()
	if prev != nil {
		maps.Copy(s.services, prev.services)
		maps.Copy(s.slices, prev.slices)
		maps.Copy(s.nodes, prev.nodes)
	}
	return s
}

// filesOf returns the files to read: path itself when dir is false, else
// the snapshot files (by name: wantedFile) in the directory path, in name
// order, whatever their type: readFile refuses those that are not regular
// files, so that a directory or FIFO put where a file was is a fault of
// that file rather than its removal. A fault of the path itself is
// returned as such.
func filesOf(path string, dir bool) ([]string, *FileError) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, statError(path, err)
	}
	if !dir {
		// readFile checks the type.
		return []string{path}, nil
	}
	if !st.IsDir() {
		return nil, fileError(path, ReasonNotRegular, errors.New("no longer a directory"))
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, statError(path, err)
	}
	var files []string
	for _, e := range entries {
		if wantedFile(e.Name()) {
			files = append(files, filepath.Join(path, e.Name()))
		}
	}
	if len(files) == 0 {
		// Removing one file of several removes its objects; removing
		// them all is far more likely a mistake (or a directory being
		// replaced) than a wish to drop every service of the node.
		return nil, fileError(path, ReasonNoFiles, errors.New("no snapshot file (*.yaml, *.yml, *.json) left in the directory"))
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
	objs   *Objects
	errs   []error
	logged int                  // errs[:logged] are in the log
	seen   map[objectKey]string // where each object was first found
	state  *state               // an entry for each object kept
	prev   *state               // objects not to decode again, or nil
	byKey  map[objectKey]any    // the objects kept

	// Of the file being parsed: the objects it added (to take them back
	// when the file turns out to be broken), the documents it has, and
	// the first problem that makes the whole file unusable.
	added []objectKey
	docs  int
	fatal *FileError
}

func newCollector() *collector {
	return &collector{objs: &Objects{}, seen: map[objectKey]string{}, state: newState(), byKey: map[objectKey]any{}}
}

func (c *collector) bad(e *DocumentError) {
	c.errs = append(c.errs, e)
}

// badFile reports a document error that makes the whole file unusable
// (see parseFile) under reason.
func (c *collector) badFile(reason string, e *DocumentError) {
	if c.fatal == nil {
		c.fatal = fileError(e.File, reason, e)
	}
	c.bad(e)
}

// ReasonUndecodable is the reason label of kproxy_invalid_objects_total
// for an object of the file that could not be used at all: no kind, no
// name, a field of the wrong type, an apiVersion not read, a duplicate.
// The model never sees it (its own reasons are the model's Reason*).
const ReasonUndecodable = "undecodable"

// kindLabel bounds the kind label of kproxy_invalid_objects_total: the
// kinds the source reads, else "other".
func kindLabel(kind string) string {
	if _, ok := apiVersions[kind]; ok {
		return kind
	}
	return "other"
}

// clip bounds a name in a log line: a file may hold one of megabytes.
func clip(s string) string {
	const limit = 512
	if len(s) <= limit {
		return s
	}
	return strings.ToValidUTF8(s[:limit], "") + fmt.Sprintf("... (%d bytes in all)", len(s))
}

// logErrors logs the errors not logged yet, and counts them in
// kproxy_invalid_objects_total (reason undecodable).
func (c *collector) logErrors() {
	for _, err := range c.errs[c.logged:] {
		if e, ok := err.(*DocumentError); ok {
			klog.ErrorS(e.Err, "Skipping object", "file", e.File, "line", e.Line, "document", e.Document, "item", e.Item,
				"kind", clip(e.Kind), "namespace", clip(e.Namespace), "name", clip(e.Name))
			metrics.InvalidObjectsTotal.WithLabelValues(kindLabel(e.Kind), ReasonUndecodable).Inc()
		}
	}
	c.logged = len(c.errs)
}

// parseFile parses one whole file and returns its fault, if the file as a
// whole cannot be used: it has no document (empty), a document that is
// not YAML or JSON, not an object, or names no kind at its top level
// (kubectl writes a List's kind after its items, so a dump cut short lost
// it). Then everything it gave is taken back and its document errors are
// not reported (the fault names the first). Otherwise its objects are
// kept and the errors of single objects are logged.
func (c *collector) parseFile(name string, data []byte) *FileError {
	nServices, nSlices, nNodes, nErrs := len(c.objs.Services), len(c.objs.EndpointSlices), len(c.objs.Nodes), len(c.errs)
	c.added, c.docs, c.fatal = nil, 0, nil
	c.parse(name, data)
	fault := c.fatal
	if fault == nil && c.docs == 0 {
		fault = fileError(name, ReasonEmpty, errors.New("empty file: no document"))
	}
	if fault == nil {
		c.logErrors()
		return nil
	}
	for _, k := range c.added {
		delete(c.seen, k)
		delete(c.byKey, k)
		delete(c.state.of(k.Kind), k)
	}
	c.objs.Services, c.objs.EndpointSlices, c.objs.Nodes = c.objs.Services[:nServices], c.objs.EndpointSlices[:nSlices], c.objs.Nodes[:nNodes]
	c.errs, c.logged = c.errs[:nErrs], nErrs
	return fault
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
		c.docs++
		if err != nil {
			c.badFile(ReasonUnparsable, &DocumentError{File: name, Document: index, Item: -1, Line: doc.line, Err: syntaxError(chunk, err)})
			continue
		}
		if string(j) == "null" {
			c.docs--
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
			c.badFile(ReasonUnparsable, &DocumentError{File: name, Document: index, Item: -1, Line: line, Err: fmt.Errorf("invalid JSON, rest of the file skipped: %w", err)})
			return
		}
		c.docs++
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
	hasItems                          bool // an items field, List or not
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
	_, h.hasItems = top["items"]
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
		c.badFile(ReasonUnparsable, &DocumentError{File: doc.file, Document: doc.index, Item: -1, Line: doc.line, Kind: h.Kind, Name: h.Name, Err: err})
		return
	}
	if h.Kind == "" {
		// What the document was meant to hold is unknown. A kubectl
		// List ends with its kind: one with items and no kind was cut.
		reason, err := ReasonUnparsable, errors.New("no kind")
		if h.hasItems {
			reason, err = ReasonTruncated, errors.New("no kind, but items: a List cut short (kubectl writes kind: List after the items)")
		}
		c.badFile(reason, &DocumentError{File: doc.file, Document: doc.index, Item: -1, Line: doc.line, Namespace: h.Namespace, Name: h.Name, Err: err})
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
			c.added = append(c.added, key)
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
	// Field names are matched exactly, as the API server matches them
	// (encoding/json alone would take "speC" for spec).
	if err := kjson.UnmarshalCaseSensitivePreserveInts(raw, obj); err != nil {
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
	c.added = append(c.added, key)
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
