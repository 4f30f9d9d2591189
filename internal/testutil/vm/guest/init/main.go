// Command init is pid 1 of the kproxy test VM: see package guest.
package main

import "github.com/kproxy/kproxy/internal/testutil/vm/guest"

func main() { guest.Main() }
