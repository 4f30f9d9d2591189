package vm

import (
	"fmt"
	"io"
	"strings"
)

// The initramfs is a cpio archive in the "newc" format the kernel unpacks
// (Documentation/driver-api/early-userspace/buffer-format.rst): per entry a
// 110-byte ASCII header ("070701" and 13 eight-digit hex fields), the NUL
// terminated name padded to 4 bytes, then the data padded to 4 bytes; a
// "TRAILER!!!" entry ends it. Written here so the tests need no cpio tool.

// File modes of cpio entries (the S_IF* bits of stat).
const (
	modeDir  = 0o040000
	modeReg  = 0o100000
	modeChar = 0o020000
)

// cpioWriter writes a newc archive. The first error sticks; Close reports it.
type cpioWriter struct {
	w   io.Writer
	n   int64 // bytes written, for padding
	ino int
	err error
}

func newCPIOWriter(w io.Writer) *cpioWriter { return &cpioWriter{w: w} }

func (c *cpioWriter) write(b []byte) {
	if c.err != nil {
		return
	}
	k, err := c.w.Write(b)
	c.n += int64(k)
	c.err = err
}

func (c *cpioWriter) pad() {
	if r := c.n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

// entry writes one header, name and data. Names are relative ("init",
// "dev/console"), as the kernel expects; a leading '/' is dropped.
func (c *cpioWriter) entry(name string, mode uint32, rdevMajor, rdevMinor uint32, data []byte) {
	name = strings.TrimPrefix(name, "/")
	c.ino++
	nlink := 1
	if mode&0o170000 == modeDir {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		c.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	c.write([]byte(hdr))
	c.write([]byte(name + "\x00"))
	c.pad()
	c.write(data)
	c.pad()
}

// Dir adds a directory.
func (c *cpioWriter) Dir(name string, perm uint32) { c.entry(name, modeDir|perm, 0, 0, nil) }

// File adds a regular file.
func (c *cpioWriter) File(name string, perm uint32, data []byte) {
	c.entry(name, modeReg|perm, 0, 0, data)
}

// CharDev adds a character device node.
func (c *cpioWriter) CharDev(name string, perm, major, minor uint32) {
	c.entry(name, modeChar|perm, major, minor, nil)
}

// Close writes the trailer and returns the first error.
func (c *cpioWriter) Close() error {
	c.ino = -1 // the trailer's inode is 0
	c.entry("TRAILER!!!", 0, 0, 0, nil)
	return c.err
}
