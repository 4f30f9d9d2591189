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
