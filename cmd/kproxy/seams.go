package main

import (
	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
)

// The kernel interfaces the proxiers program pass through these two
// functions. A normal build leaves them as they are; a build with the tag
// faultinject (faultinject.go, used by test/kernel only) wraps them so
// that the kernel refuses chosen operations, which is how the failure
// isolation of internal/proxy/isolate.go is tested against the real
// kernel with real traffic.
var (
	wrapNFT     = func(i nft.Interface) nft.Interface { return i }
	wrapXtables = func(i xtables.Interface) xtables.Interface { return i }
)
