package harness

import (
	"bufio"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// Sync is one sync of one IP family as kproxy logs it (with --v=4):
// "Synced" (loop: seconds, modelSeconds), "Applied nftables transaction"
// (nftables proxier: renderSeconds; netlink: lowerSeconds, kernelSeconds,
// bytes, messages), "Applied iptables rules" (renderSeconds, seconds,
// bytes). Kernel is the kernel's share (the netlink batch's commit, or
// iptables-restore), Lower nftables' encoding into netlink messages.
type Sync struct {
	Full     bool    `json:"full"`
	Seconds  float64 `json:"seconds"`
	Model    float64 `json:"model"`
	Render   float64 `json:"render"`
	Lower    float64 `json:"lower"`
	Kernel   float64 `json:"kernel"`
	Bytes    int     `json:"bytes"`
	Messages int     `json:"messages"`
}

var kv = regexp.MustCompile(`(\w+)=("(?:[^"\\]|\\.)*"|\S+)`)

// fields are a klog structured line's message and key=value pairs.
func fields(line string) (string, map[string]string) {
	i := strings.Index(line, "] \"")
	if i < 0 {
		return "", nil
	}
	rest := line[i+3:]
	j := strings.IndexByte(rest, '"')
	if j < 0 {
		return "", nil
	}
	msg, kvs := rest[:j], map[string]string{}
	for _, m := range kv.FindAllStringSubmatch(rest[j+1:], -1) {
		kvs[m[1]] = strings.Trim(m[2], `"`)
	}
	return msg, kvs
}

func num(m map[string]string, k string) float64 {
	v, _ := strconv.ParseFloat(m[k], 64)
	return v
}

// readSyncs parses the syncs logged in path from offset on and returns
// them and the offset after the last whole line.
func readSyncs(path string, offset int64) ([]Sync, int64) {
	f, err := os.Open(path)
	if err != nil {
		return nil, offset
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return nil, offset
	}
	var out []Sync
	var cur Sync
	r := bufio.NewReaderSize(f, 1<<16)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			break // a partial last line is read again next time
		}
		offset += int64(len(line))
		msg, m := fields(line)
		switch msg {
		case "Applied nftables transaction":
			if _, ok := m["kernelSeconds"]; ok { // netlink, the batch itself
				cur.Lower += num(m, "lowerSeconds")
				cur.Kernel += num(m, "kernelSeconds")
				b, _ := strconv.Atoi(m["bytes"])
				n, _ := strconv.Atoi(m["messages"])
				cur.Bytes += b
				cur.Messages += n
			} else if _, ok := m["renderSeconds"]; ok {
				cur.Render += num(m, "renderSeconds")
			}
		case "Applied iptables rules":
			cur.Render += num(m, "renderSeconds")
			cur.Kernel += num(m, "seconds") - num(m, "renderSeconds")
			b, _ := strconv.Atoi(m["bytes"])
			cur.Bytes += b
		case "Applied ipvs state":
			// One line per family: the planner's render, then the
			// netlink and iptables-restore work.
			cur.Render += num(m, "renderSeconds")
			cur.Kernel += num(m, "seconds") - num(m, "renderSeconds")
		case "Synced":
			cur.Full = m["full"] == "true"
			cur.Seconds = num(m, "seconds")
			cur.Model = num(m, "modelSeconds")
			out = append(out, cur)
			cur = Sync{}
		}
	}
	return out, offset
}
