//go:build unix

package file

import (
	"os"
	"syscall"
)

// inodeOf tells a file replaced by rename from the one before, even when
// size and time are the same.
func inodeOf(st os.FileInfo) uint64 {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return uint64(s.Ino)
	}
	return 0
}

// openNonblock makes opening a FIFO return at once instead of waiting for
// a writer (readFile refuses it right after, through the descriptor).
const openNonblock = syscall.O_NONBLOCK
