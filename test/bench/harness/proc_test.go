package harness

import (
	"os"
	"os/exec"
	"testing"
)

// TestCPUSecondsCountsChildren: a proxy's CPU includes the nft and
// iptables-restore processes it ran. The test's own process burns little
// CPU while a shell it waits for spins; the difference must show the
// shell's time.
func TestCPUSecondsCountsChildren(t *testing.T) {
	before := cpuSeconds(os.Getpid())
	if before < 0 {
		t.Fatal("cannot read /proc/self/stat")
	}
	cmd := exec.Command("sh", "-c", "i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	child := (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	if child < 0.1 {
		t.Fatalf("the shell took only %.2f CPU s: too little to tell", child)
	}
	after := cpuSeconds(os.Getpid())
	// Ticks are 10 ms; allow two of them for rounding.
	if got := after - before; got < child-0.02 {
		t.Errorf("CPU grew by %.2f s while a child used %.2f s: children not counted", got, child)
	}
}
