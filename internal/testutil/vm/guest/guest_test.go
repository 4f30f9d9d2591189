package guest

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A small modules.dep in depmod's format: each module's path, then every
// module it needs, transitively.
const testModulesDep = `kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko kernel/fs/netfs/netfs.ko kernel/fs/fscache/fscache.ko
kernel/net/9p/9pnet.ko:
kernel/net/9p/9pnet_virtio.ko: kernel/net/9p/9pnet.ko kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko
kernel/fs/netfs/netfs.ko:
kernel/fs/fscache/fscache.ko: kernel/fs/netfs/netfs.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/net/sctp/sctp.ko: kernel/net/ipv4/udp_tunnel.ko kernel/lib/libcrc32c.ko
kernel/net/ipv4/udp_tunnel.ko:
kernel/lib/libcrc32c.ko:
kernel/net/netfilter/nft_ct.ko: kernel/net/netfilter/nf_tables.ko
kernel/net/netfilter/nft_nat.ko: kernel/net/netfilter/nf_tables.ko
kernel/net/netfilter/nf_tables.ko: kernel/lib/libcrc32c.ko
kernel/drivers/net/dummy.ko:
kernel/net/loopy/a.ko: kernel/net/loopy/b.ko
kernel/net/loopy/b.ko: kernel/net/loopy/a.ko
kernel/net/broken/needs-ghost.ko: kernel/net/broken/ghost.ko
`

const testModulesBuiltin = `kernel/net/ipv4/tcp_cubic.ko
kernel/drivers/net/veth.ko
`

func TestModulesOrder(t *testing.T) {
	mods, err := ParseModules(strings.NewReader(testModulesDep), strings.NewReader(testModulesBuiltin))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		modules []string
		want    []string
		wantErr string
	}{
		{
			name:    "dependencies first, each once",
			modules: []string{"9pnet_virtio", "9p"},
			want: []string{
				"kernel/net/9p/9pnet.ko", "kernel/drivers/virtio/virtio_ring.ko", "kernel/drivers/virtio/virtio.ko",
				"kernel/net/9p/9pnet_virtio.ko", "kernel/fs/netfs/netfs.ko", "kernel/fs/fscache/fscache.ko",
				"kernel/fs/9p/9p.ko",
			},
		},
		{
			name:    "a module asked twice and as a dependency",
			modules: []string{"libcrc32c", "sctp", "sctp"},
			want:    []string{"kernel/lib/libcrc32c.ko", "kernel/net/ipv4/udp_tunnel.ko", "kernel/net/sctp/sctp.ko"},
		},
		{
			name:    "built-in modules are skipped",
			modules: []string{"veth", "tcp_cubic", "dummy"},
			want:    []string{"kernel/drivers/net/dummy.ko"},
		},
		{
			name:    "dashes and underscores are one",
			modules: []string{"needs_ghost"},
			wantErr: "module ghost (needed by needs_ghost) is not in modules.dep",
		},
		{
			name:    "glob in name order",
			modules: []string{"nft_*"},
			want:    []string{"kernel/lib/libcrc32c.ko", "kernel/net/netfilter/nf_tables.ko", "kernel/net/netfilter/nft_ct.ko", "kernel/net/netfilter/nft_nat.ko"},
		},
		{name: "unknown module", modules: []string{"ip_vs"}, wantErr: "module ip_vs is neither in modules.dep nor built in"},
		{name: "glob without match", modules: []string{"ip_vs*"}, wantErr: `module pattern "ip_vs*" matches no module`},
		{name: "cycle", modules: []string{"a"}, wantErr: "module dependency cycle through a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := mods.Order(tc.modules...)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("Order(%v) error = %v, want %q", tc.modules, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Order(%v) (-want +got):\n%s", tc.modules, diff)
			}
		})
	}
}

func TestParseModulesRejectsGarbage(t *testing.T) {
	if _, err := ParseModules(strings.NewReader("kernel/x.ko kernel/y.ko\n"), nil); err == nil {
		t.Fatal("a modules.dep line without ':' was accepted")
	}
}

func TestModuleName(t *testing.T) {
	for in, want := range map[string]string{
		"kernel/net/9p/9pnet_virtio.ko":         "9pnet_virtio",
		"kernel/net/netfilter/nf_conntrack.ko":  "nf_conntrack",
		"kernel/drivers/net/needs-ghost.ko.xz":  "needs_ghost",
		"kernel/fs/overlayfs/overlay.ko.zst":    "overlay",
		"br-netfilter":                          "br_netfilter",
		"/lib/modules/6.1.0-57-amd64/x/sctp.ko": "sctp",
	} {
		if got := ModuleName(in); got != want {
			t.Errorf("ModuleName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestMarkers(t *testing.T) {
	const nonce = "0123abcd"
	for _, tc := range []struct {
		line     string
		kind     string
		rest     string
		isMarker bool
	}{
		{line: ReadyLine(nonce), kind: MarkReady, isMarker: true},
		{line: ExitLine(nonce, 0), kind: MarkExit, rest: "0", isMarker: true},
		{line: ExitLine(nonce, 137), kind: MarkExit, rest: "137", isMarker: true},
		{line: ErrorLine(nonce, errors.New("mount:\nno such device")), kind: MarkError, rest: "mount: | no such device", isMarker: true},
		// Another run's nonce, a made-up kind, ordinary output.
		{line: ExitLine("ffff0000", 0)},
		{line: MarkerPrefix(nonce) + "reboot"},
		{line: "kproxy-vm: hello"},
	} {
		kind, rest, ok := ParseMarker(tc.line, nonce)
		if kind != tc.kind || rest != tc.rest || ok != tc.isMarker {
			t.Errorf("ParseMarker(%q) = %q, %q, %v; want %q, %q, %v", tc.line, kind, rest, ok, tc.kind, tc.rest, tc.isMarker)
		}
	}
	if code, err := ParseExit("42"); err != nil || code != 42 {
		t.Errorf("ParseExit(42) = %d, %v", code, err)
	}
	if _, err := ParseExit("x"); err == nil {
		t.Error("ParseExit(x) accepted")
	}
}

func TestHiddenBy(t *testing.T) {
	tmpfs := []string{"/tmp", "/run"}
	for p, want := range map[string]bool{
		"/tmp":                  true,
		"/tmp/go-build1/b001/x": true,
		"/run/kproxy-vm":        true,
		"/tmpfoo/x":             false,
		"/work/main":            false,
		"/var/tmp/x":            false,
	} {
		if got := hiddenBy(p, tmpfs); got != want {
			t.Errorf("hiddenBy(%q) = %v, want %v", p, got, want)
		}
	}
}
