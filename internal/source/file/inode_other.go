//go:build !unix

package file

import "os"

func inodeOf(os.FileInfo) uint64 { return 0 }

const openNonblock = 0
