package file

// File-level faults. A snapshot file that cannot be read as a whole (gone,
// not a regular file, too large, empty, cut short, not YAML or JSON) says
// nothing about the cluster: most often it is being written in place, or
// was removed or replaced by mistake. The objects it gave before are kept,
// and nothing is deleted, until it is good again. Only a file that is
// readable and whole changes what the node is given; objects inside it
// that are wrong are skipped one by one (DocumentError, and the model's
// own validation), the rest of the file applies.
//
// Reads never block: the file's type is checked before it is opened,
// it is opened with O_NONBLOCK and checked again through the open
// descriptor (it may have been swapped between the two), and at most
// maxFileSize+1 bytes are read. A FIFO, a socket or a device is refused
// without reading; opening a FIFO without O_NONBLOCK would wait for a
// writer, and reading it would wait forever.

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"strings"

	"github.com/kproxy/kproxy/internal/metrics"
)

// maxFileSize bounds one snapshot file. A `kubectl get -o yaml` dump of
// 10k services and their slices is ~40 MiB; 256 MiB leaves room for much
// larger clusters while keeping a mistaken path (a disk image, a log)
// from being read into memory.
const maxFileSize = 256 << 20

// Reasons of file-level faults: the reason label of
// kproxy_source_file_errors_total, a fixed set.
const (
	ReasonMissing    = "missing"     // the path, or a file being read, does not exist
	ReasonUnreadable = "unreadable"  // permission denied, I/O error
	ReasonNotRegular = "not_regular" // a directory, FIFO, socket or device where a file was
	ReasonTooLarge   = "too_large"   // over maxFileSize
	ReasonEmpty      = "empty"       // no document: only whitespace, comments or "---"
	ReasonUnparsable = "unparsable"  // not YAML or JSON, or a document that is not an object
	ReasonTruncated  = "truncated"   // looks cut short (a List that lost its trailing kind)
	ReasonNoFiles    = "no_files"    // directory mode: no snapshot file left in the directory
)

// Reasons lists every reason, for metrics that want all series present.
var Reasons = []string{ReasonMissing, ReasonUnreadable, ReasonNotRegular, ReasonTooLarge, ReasonEmpty, ReasonUnparsable, ReasonTruncated, ReasonNoFiles}

// FileError is a file-level fault: File (a snapshot file, or the path
// given to the source) could not be used as a whole. The objects it gave
// before are kept.
type FileError struct {
	File   string
	Reason string // one of the Reason constants
	Err    error
}

func (e *FileError) Error() string {
	return e.File + ": " + e.Err.Error()
}

func (e *FileError) Unwrap() error { return e.Err }

func fileError(name, reason string, err error) *FileError {
	return &FileError{File: name, Reason: reason, Err: err}
}

// statError classifies an error of Stat or Open.
func statError(name string, err error) *FileError {
	if errors.Is(err, fs.ErrNotExist) {
		return fileError(name, ReasonMissing, err)
	}
	return fileError(name, ReasonUnreadable, err)
}

// notRegular describes why a file of mode m cannot be read.
func notRegular(name string, m fs.FileMode) *FileError {
	what := "not a regular file"
	switch {
	case m.IsDir():
		what = "a directory, not a file"
	case m&fs.ModeNamedPipe != 0:
		what = "a FIFO, not a regular file"
	case m&fs.ModeSocket != 0:
		what = "a socket, not a regular file"
	case m&fs.ModeDevice != 0:
		what = "a device, not a regular file"
	}
	return fileError(name, ReasonNotRegular, errors.New(what+" (refused without reading)"))
}

// readFile reads a snapshot file without ever blocking on it: see the
// package comment at the top of this file. limit is the largest size
// accepted.
func readFile(name string, limit int64) ([]byte, *FileError) {
	st, err := os.Stat(name) // follows symlinks, as ConfigMap volumes need
	if err != nil {
		return nil, statError(name, err)
	}
	if !st.Mode().IsRegular() {
		return nil, notRegular(name, st.Mode())
	}
	if st.Size() > limit {
		return nil, fileError(name, ReasonTooLarge, fmt.Errorf("%d bytes, more than the %d accepted", st.Size(), limit))
	}
	f, err := os.OpenFile(name, os.O_RDONLY|openNonblock, 0)
	if err != nil {
		return nil, statError(name, err)
	}
	defer f.Close()
	// The name may have been given to something else since the Stat.
	if st, err = f.Stat(); err != nil {
		return nil, fileError(name, ReasonUnreadable, err)
	}
	if !st.Mode().IsRegular() {
		return nil, notRegular(name, st.Mode())
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fileError(name, ReasonUnreadable, err)
	}
	if int64(len(data)) > limit {
		return nil, fileError(name, ReasonTooLarge, fmt.Errorf("more than the %d bytes accepted", limit))
	}
	return data, nil
}

// countFaults counts faults in kproxy_source_file_errors_total.
func countFaults(faults []*FileError) {
	for _, f := range faults {
		metrics.SourceFileErrorsTotal.WithLabelValues(f.Reason).Inc()
	}
}

// problemOf is the one line given to Options.OnProblem: the first fault and
// how many more there are; "" when there is none.
func problemOf(faults []*FileError) string {
	if len(faults) == 0 {
		return ""
	}
	fs := append([]*FileError(nil), faults...)
	sort.SliceStable(fs, func(i, j int) bool { return fs[i].File < fs[j].File })
	var b strings.Builder
	b.WriteString(fs[0].Reason + ": " + fs[0].Error())
	if len(fs) > 1 {
		fmt.Fprintf(&b, " (and %d more)", len(fs)-1)
	}
	return b.String()
}
