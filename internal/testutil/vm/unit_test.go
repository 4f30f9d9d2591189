package vm

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kproxy/kproxy/internal/testutil/vm/guest"
)

// cpioEntry is one parsed newc entry.
type cpioEntry struct {
	Name         string
	Mode         uint32
	RdevMajor    uint32
	RdevMinor    uint32
	Data         string
	Ino, NLink   uint32
	NameSizeOK   bool
	HeaderOffset int
}

// parseNewc reads a newc archive the way the kernel does (init/initramfs.c):
// header, name padded to 4, data padded to 4, up to TRAILER!!!.
func parseNewc(t *testing.T, b []byte) []cpioEntry {
	t.Helper()
	var out []cpioEntry
	off := 0
	pad := func(n int) int { return (n + 3) &^ 3 }
	for {
		if off+110 > len(b) {
			t.Fatalf("archive ends inside a header at %d", off)
		}
		h := string(b[off : off+110])
		if h[:6] != "070701" {
			t.Fatalf("bad magic %q at %d", h[:6], off)
		}
		field := func(i int) uint32 {
			v, err := strconv.ParseUint(h[6+8*i:14+8*i], 16, 32)
			if err != nil {
				t.Fatalf("header field %d at %d: %v", i, off, err)
			}
			return uint32(v)
		}
		nameSize, fileSize := int(field(11)), int(field(6))
		nameStart := off + 110
		name := string(b[nameStart : nameStart+nameSize-1])
		if b[nameStart+nameSize-1] != 0 {
			t.Fatalf("name %q not NUL terminated", name)
		}
		dataStart := pad(nameStart + nameSize)
		e := cpioEntry{
			Name: name, Mode: field(1), NLink: field(4), Ino: field(0),
			RdevMajor: field(9), RdevMinor: field(10),
			Data: string(b[dataStart : dataStart+fileSize]), HeaderOffset: off,
		}
		off = pad(dataStart + fileSize)
		if name == "TRAILER!!!" {
			if off != len(b) {
				t.Fatalf("%d bytes after the trailer", len(b)-off)
			}
			return out
		}
		out = append(out, e)
	}
}

func TestCPIOWriter(t *testing.T) {
	var buf bytes.Buffer
	w := newCPIOWriter(&buf)
	w.Dir("dev", 0o755)
	w.CharDev("/dev/console", 0o600, 5, 1)
	w.File("init", 0o755, []byte("#!x")) // 3 bytes: data padding
	w.File("modules/a.ko", 0o644, nil)   // empty file
	w.File("kproxy-vm.json", 0o644, []byte("{}\n\n"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	if len(b)%4 != 0 {
		t.Errorf("archive length %d is not a multiple of 4", len(b))
	}
	// The first header, field by field (ino 1, directory 0755, nlink 2,
	// name "dev\0" of 4 bytes), then the name padded to 4 (110+4 -> 116).
	wantHdr := "070701" + "00000001" + "000041ed" + "00000000" + "00000000" + "00000002" + "00000000" +
		"00000000" + "00000000" + "00000000" + "00000000" + "00000000" + "00000004" + "00000000"
	if got := string(b[:110]); got != wantHdr {
		t.Errorf("first header\n got %s\nwant %s", got, wantHdr)
	}
	if got := hex.EncodeToString(b[110:116]); got != "646576000000" {
		t.Errorf("first name with padding = %s, want dev\\0 + 2 NULs", got)
	}
	got := parseNewc(t, b)
	want := []cpioEntry{
		{Name: "dev", Mode: modeDir | 0o755, NLink: 2, Ino: 1},
		{Name: "dev/console", Mode: modeChar | 0o600, RdevMajor: 5, RdevMinor: 1, NLink: 1, Ino: 2},
		{Name: "init", Mode: modeReg | 0o755, Data: "#!x", NLink: 1, Ino: 3},
		{Name: "modules/a.ko", Mode: modeReg | 0o644, NLink: 1, Ino: 4},
		{Name: "kproxy-vm.json", Mode: modeReg | 0o644, Data: "{}\n\n", NLink: 1, Ino: 5},
	}
	for i := range got {
		if got[i].HeaderOffset%4 != 0 {
			t.Errorf("entry %s starts at %d, not 4-aligned", got[i].Name, got[i].HeaderOffset)
		}
		got[i].HeaderOffset = 0
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("entries (-want +got):\n%s", diff)
	}
}

type failingWriter struct{ after int }

func (f *failingWriter) Write(p []byte) (int, error) {
	if f.after <= 0 {
		return 0, fmt.Errorf("disk full")
	}
	f.after--
	return len(p), nil
}

func TestCPIOWriterKeepsFirstError(t *testing.T) {
	w := newCPIOWriter(&failingWriter{after: 2})
	w.File("a", 0o644, []byte("x"))
	w.File("b", 0o644, []byte("y"))
	if err := w.Close(); err == nil || err.Error() != "disk full" {
		t.Fatalf("Close() = %v, want the write error", err)
	}
}

func TestKernelCmdline(t *testing.T) {
	for _, tc := range []struct {
		debug bool
		want  string
	}{
		{false, "console=ttyS0 rdinit=/init panic=-1 mitigations=off quiet loglevel=3"},
		{true, "console=ttyS0 rdinit=/init panic=-1 mitigations=off loglevel=7"},
	} {
		if got := kernelCmdline(tc.debug); got != tc.want {
			t.Errorf("kernelCmdline(%v) = %q, want %q", tc.debug, got, tc.want)
		}
	}
}

func TestQEMUArgs(t *testing.T) {
	spec := qemuSpec{Accel: "tcg", MemoryMiB: 1536, CPUs: 2, Kernel: "/k/vmlinuz", Initrd: "/t/i.cpio", Cmdline: "console=ttyS0"}
	want := []string{
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-machine", "q35", "-accel", "tcg", "-cpu", "max",
		"-m", "1536", "-smp", "2",
		"-kernel", "/k/vmlinuz", "-initrd", "/t/i.cpio", "-append", "console=ttyS0",
		"-serial", "stdio",
		"-fsdev", "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap",
		"-device", "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot",
	}
	if diff := cmp.Diff(want, qemuArgs(spec)); diff != "" {
		t.Errorf("tcg (-want +got):\n%s", diff)
	}
	spec.Accel = "kvm"
	got := strings.Join(qemuArgs(spec), " ")
	if !strings.Contains(got, "-accel kvm -cpu host ") {
		t.Errorf("kvm: %s", got)
	}
}

func TestConsole(t *testing.T) {
	const nonce = "n0nce"
	var out []string
	c := &console{nonce: nonce, output: func(l string) { out = append(out, l) }, exitCode: -1}
	for _, l := range []string{
		"[    0.000000] Linux version 6.1.0",
		"kproxy-vm init: loading /modules/9p.ko",
		guest.ReadyLine(nonce),
		"=== RUN   TestX",
		guest.ExitLine("other", 3), // not ours: output
		"no newline at the end" + guest.ExitLine(nonce, 7),
		"[    9.000000] reboot: Power down",
	} {
		c.line(l)
	}
	wantOut := []string{"=== RUN   TestX", guest.ExitLine("other", 3), "no newline at the end"}
	if diff := cmp.Diff(wantOut, out); diff != "" {
		t.Errorf("output (-want +got):\n%s", diff)
	}
	wantConsole := []string{"[    0.000000] Linux version 6.1.0", "kproxy-vm init: loading /modules/9p.ko", "[    9.000000] reboot: Power down"}
	if diff := cmp.Diff(wantConsole, c.lines); diff != "" {
		t.Errorf("console (-want +got):\n%s", diff)
	}
	if !c.ready || !c.exited || c.exitCode != 7 || c.err != nil {
		t.Errorf("ready %v exited %v code %d err %v; want ready, exited, 7, no error", c.ready, c.exited, c.exitCode, c.err)
	}

	c = &console{nonce: nonce, exitCode: -1}
	c.line(guest.ErrorLine(nonce, fmt.Errorf("mount 9p: no such device")))
	if c.err == nil || !strings.Contains(c.err.Error(), "mount 9p: no such device") || c.exited {
		t.Errorf("error marker: err %v exited %v", c.err, c.exited)
	}
}

func TestTestEnv(t *testing.T) {
	host := []string{
		"PATH=/usr/local/go/bin:/usr/bin", "HOME=/root", "TMPDIR=/scratch", "GOFLAGS=-mod=mod",
		"KPROXY_KERNEL_TEST_DUMP=1", "KPROXY_IN_VM=0", "SSH_AUTH_SOCK=/tmp/x",
	}
	got := testEnv(host, []string{"KPROXY_KERNEL_TEST_BIN=/tmp/b/kproxy"})
	want := []string{
		"PATH=/usr/local/go/bin:/usr/bin", "HOME=/root", "KPROXY_KERNEL_TEST_DUMP=1",
		"KPROXY_KERNEL_TEST_BIN=/tmp/b/kproxy", "KPROXY_IN_VM=1",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("testEnv (-want +got):\n%s", diff)
	}
}

func TestPathValues(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "kproxy")
	if err := os.WriteFile(file, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	got := pathValues([]string{"A=" + file, "B=" + dir, "C=relative/path", "D=" + filepath.Join(dir, "missing"), "E=1"})
	if diff := cmp.Diff([]string{file, dir}, got); diff != "" {
		t.Errorf("pathValues (-want +got):\n%s", diff)
	}
}

func TestTestResults(t *testing.T) {
	for _, tc := range []struct {
		name   string
		output string
		want   testResults
	}{
		{
			name: "pass with subtests",
			output: `=== RUN   TestSCTP
=== RUN   TestSCTP/sctp_198.19.0.19:9999
--- PASS: TestSCTP (31.10s)
    --- PASS: TestSCTP/sctp_198.19.0.19:9999 (0.08s)
PASS`,
			want: testResults{ran: 1, passed: 1},
		},
		{
			name: "skip",
			output: `=== RUN   TestSCTP
--- SKIP: TestSCTP (0.00s)
PASS`,
			want: testResults{ran: 1, skipped: 1},
		},
		{name: "nothing matched", output: "testing: warning: no tests to run\nPASS"},
		{
			name: "fail",
			output: `=== RUN   TestA
--- FAIL: TestA (1.00s)
=== RUN   TestB
--- PASS: TestB (0.00s)
FAIL`,
			want: testResults{ran: 2, passed: 1, failed: 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r testResults
			for _, l := range strings.Split(tc.output, "\n") {
				r.add(l)
			}
			if r != tc.want {
				t.Errorf("got %+v, want %+v", r, tc.want)
			}
		})
	}
}

func TestHasHardwareVirt(t *testing.T) {
	for _, tc := range []struct {
		name, cpuinfo string
		want          bool
	}{
		{"intel", "processor\t: 0\nflags\t\t: fpu vme vmx sse2\n", true},
		{"amd", "processor\t: 0\nflags\t\t: fpu svm lm\n", true},
		// A VM without nested virtualization (/dev/kvm may still be PVM).
		{"none", "processor\t: 0\nflags\t\t: fpu vme hypervisor avx2\nvmx flags\t: ept\n", false},
		{"no flags line", "processor\t: 0\n", false},
	} {
		if got := hasHardwareVirt(tc.cpuinfo); got != tc.want {
			t.Errorf("%s: hasHardwareVirt = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestParseSuite(t *testing.T) {
	in := `# comment
./test/kernel   TestSCTP TestOther   env=A=$KPROXY modules=a,b
./internal/x    TestY  gate=TestG,TestH  # trailing comment
./test/bench    gate=TestBench
`
	got, err := ParseSuite(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []SuiteEntry{
		{Pkg: "./test/kernel", Tests: []string{"TestSCTP", "TestOther"}, Env: []string{"A=$KPROXY"}, Modules: []string{"a", "b"}},
		{Pkg: "./internal/x", Tests: []string{"TestY"}, Gates: []string{"TestG", "TestH"}},
		{Pkg: "./test/bench", Gates: []string{"TestBench"}},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("ParseSuite (-want +got):\n%s", d)
	}
	if s := SuiteSkip(got); s != "^(TestSCTP|TestOther|TestY|TestG|TestH|TestBench)$" {
		t.Errorf("SuiteSkip = %q", s)
	}
	for _, bad := range []string{"test/kernel TestA\n", "./x\n", "./x TestA env=novalue\n", "./x TestA whatever\n"} {
		if _, err := ParseSuite(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseSuite(%q) took it", bad)
		}
	}
}

func TestSplitSuite(t *testing.T) {
	lines := []string{
		"boot noise",
		suiteMarker + " 0 start",
		"=== RUN   TestA",
		"--- PASS: TestA (0.01s)",
		"=== RUN   TestB",
		"    --- SKIP: TestB/sub (0.00s)",
		"--- SKIP: TestB (0.00s)",
		suiteMarker + " 0 exit 0",
		suiteMarker + " 1 start",
		"=== RUN   TestC",
		"--- FAIL: TestC (1.00s)",
		suiteMarker + " 1 exit 1",
		suiteMarker + " 2 start",
		"=== RUN   TestD",
	}
	s := splitSuite(lines, 3)
	if !s[0].ended || s[0].exit != 0 || s[0].outcome["TestA"] != "PASS" || s[0].outcome["TestB"] != "SKIP" || s[0].outcome["TestB/sub"] != "" {
		t.Errorf("section 0: %+v", s[0])
	}
	if !s[1].ended || s[1].exit != 1 || s[1].outcome["TestC"] != "FAIL" || s[1].results.failed != 1 {
		t.Errorf("section 1: %+v", s[1])
	}
	if s[2].ended || len(s[2].lines) != 1 {
		t.Errorf("section 2 (VM stopped in it): %+v", s[2])
	}
	script := suiteScript("/repo", []SuiteEntry{{Pkg: "./a", Tests: []string{"TestA", "TestB"}, Env: []string{"BIN=$KPROXY"}}}, []string{"/tmp/s/0-a.test"}, "/tmp/s/kproxy", time.Minute)
	for _, want := range []string{"cd '/repo/a'", "env 'BIN=/tmp/s/kproxy' '/tmp/s/0-a.test' -test.run '^(TestA|TestB)$'", suiteMarker + ` 0 exit $?`} {
		if !strings.Contains(script, want) {
			t.Errorf("script lacks %q:\n%s", want, script)
		}
	}
}

// FindKernel looks where test/vm/prepare.sh put the kernel: under
// KPROXY_VM_CACHE when that is set, as the script does.
func TestFindKernelCacheDir(t *testing.T) {
	cache := t.TempDir()
	rel := filepath.Join(cache, "6.1.0-test")
	if err := os.MkdirAll(filepath.Join(rel, "lib/modules/6.1.0-test"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"vmlinuz", "lib/modules/6.1.0-test/modules.dep"} {
		if err := os.WriteFile(filepath.Join(rel, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("6.1.0-test", filepath.Join(cache, "current")); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvKernelDir, "")
	t.Setenv(EnvCacheDir, cache)
	k, err := FindKernel()
	if err != nil {
		t.Fatal(err)
	}
	if k.Dir != rel || k.Release != "6.1.0-test" {
		t.Errorf("FindKernel = %+v, want the release in %s", k, cache)
	}
	t.Setenv(EnvCacheDir, filepath.Join(cache, "nothing"))
	if _, err := FindKernel(); err == nil || !strings.Contains(err.Error(), "prepare.sh") {
		t.Errorf("no kernel in the cache: %v", err)
	}
}
