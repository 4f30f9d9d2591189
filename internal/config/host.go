package config

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/fsnotify/fsnotify"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kproxy/kproxy/internal/model"
)

// What the running proxy takes from this host besides the configuration:
// its node name, its IP families, and changes of its --config file.

// Hostname returns the node name kproxy acts for.
func Hostname(c *v1alpha1.KubeProxyConfiguration) (string, error) {
	// Trimmed and lower-cased either way, as upstream's GetHostname: a
	// config file's "Node-A" names node-a.
	if c.HostnameOverride != "" {
		if h := NormalizeHostname(c.HostnameOverride); h != "" {
			return h, nil
		}
		return "", fmt.Errorf("hostnameOverride %q is blank", c.HostnameOverride)
	}
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("reading the hostname (set --hostname-override): %w", err)
	}
	if h = NormalizeHostname(h); h == "" {
		return "", fmt.Errorf("the hostname is blank (set --hostname-override)")
	}
	return h, nil
}

// IPv6Available reports whether this network namespace has IPv6 at all.
func IPv6Available() bool {
	_, err := os.Stat("/proc/net/if_inet6")
	return err == nil
}

// Families lists the IP families to proxy, primary first: both when the
// namespace has IPv6, as upstream does. The primary family follows the first
// cluster CIDR (IPv4 when none is given).
func Families(c *v1alpha1.KubeProxyConfiguration, v6 bool) []v1.IPFamily {
	if !v6 {
		return []v1.IPFamily{model.IPv4}
	}
	if cidrs := ClusterCIDRs(c); len(cidrs) > 0 && model.FamilyOf(cidrs[0].Addr()) == model.IPv6 {
		return []v1.IPFamily{model.IPv6, model.IPv4}
	}
	return []v1.IPFamily{model.IPv4, model.IPv6}
}

// ErrFileChanged ends kproxy when its config file changes.
var ErrFileChanged = errors.New("content of the proxy server's configuration file was updated")

// WatchFile sends ErrFileChanged to errc when path changes, as
// upstream does (it exits, so that the pod restarts with the new
// ConfigMap). Upstream reacts to writes and renames of the file; kproxy
// also to its removal, which is what a ConfigMap volume update does to the
// file the mounted symlink pointed at (the old ..data directory is
// deleted), so that an edited ConfigMap restarts the proxy.
func WatchFile(ctx context.Context, path string, errc chan<- error) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching the config file %s: %w", path, err)
	}
	if err := w.Add(path); err != nil {
		w.Close()
		return fmt.Errorf("watching the config file %s: %w", path, err)
	}
	go func() {
		defer w.Close()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if ev.Has(fsnotify.Write) || ev.Has(fsnotify.Rename) || ev.Has(fsnotify.Remove) {
					klog.InfoS("Config file changed; exiting so that kproxy restarts with the new configuration", "file", path, "event", ev.Op.String())
					errc <- ErrFileChanged
					return
				}
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				errc <- fmt.Errorf("watching the config file %s: %w", path, err)
				return
			}
		}
	}()
	return nil
}
