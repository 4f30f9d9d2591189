package harness

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// procStatusMiB reads a kB field of /proc/PID/status (VmRSS, VmHWM) in MiB;
// -1 when it cannot.
func procStatusMiB(pid int, field string) float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), field+":"); ok {
			v, err := strconv.Atoi(strings.Fields(rest)[0])
			if err != nil {
				return -1
			}
			return float64(v) / 1024
		}
	}
	return -1
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100

// cpuSeconds is the process's user + system CPU time, its waited-for
// children's included (/proc/PID/stat fields 14 to 17); -1 when it cannot
// be read. The children count: upstream's nftables mode hands every
// transaction to an `nft` process and both proxies' iptables modes to
// iptables-restore, whose commits would otherwise be missing from the
// proxy's CPU while kproxy's own netlink commits are in it.
func cpuSeconds(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(string(data)[i+1:])
	if len(f) < 15 {
		return -1
	}
	ticks := 0.0
	for _, field := range f[11:15] { // utime, stime, cutime, cstime
		v, err := strconv.ParseFloat(field, 64)
		if err != nil {
			return -1
		}
		ticks += v
	}
	return ticks / clockTicks
}
