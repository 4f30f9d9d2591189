package main

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kproxy/kproxy/internal/config"
)

// Events upstream kube-proxy v1.37.2 records about its node
// (cmd/kube-proxy/app/server.go, server_linux.go), through the
// events.k8s.io API with reportingController "kube-proxy" and action
// StartKubeProxy. kproxy records the same when the API server is its
// source, IPVSDeprecation included (ipvs mode).
const (
	eventActionStart = "StartKubeProxy"

	reasonStarting            = "Starting"
	reasonDefaultMode         = "KubeProxyDefaultMode"
	reasonIPVSDeprecation     = "IPVSDeprecation"
	reasonFailedHealthzServer = "FailedToStartProxierHealthcheck"
	reasonFailedMetricsServer = "FailedToStartMetricServer"

	// defaultModeMessage is upstream's text, logged and recorded when no
	// mode is configured.
	defaultModeMessage = "No kube-proxy mode specified: defaulting to 'iptables'. Note that in Kubernetes 1.40 the default mode will switch to 'nftables'. If you wish to continue using 'iptables' mode, you must explicitly specify 'mode: iptables' in the kube-proxy config file, or '--proxy-mode iptables' on the kube-proxy command line."
)

// newEventRecorder starts an events broadcaster to the API server's
// events.k8s.io API and returns its recorder (component kube-proxy, as
// upstream) and a function that stops it.
func newEventRecorder(ctx context.Context, client kubernetes.Interface) (events.EventRecorder, func()) {
	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	broadcaster.StartRecordingToSink(ctx.Done())
	return broadcaster.NewRecorder(scheme.Scheme, "kube-proxy"), broadcaster.Shutdown
}

// setUpEvents returns the Event recorder (nil without an API client: the
// file source), the node's start Events and a function that stops the
// broadcaster. It records KubeProxyDefaultMode when no mode is configured,
// as upstream when it creates its proxier.
func setUpEvents(ctx context.Context, client kubernetes.Interface, c *v1alpha1.KubeProxyConfiguration, node string) (events.EventRecorder, nodeEvents, func()) {
	var rec events.EventRecorder
	stop := func() {}
	if client != nil {
		rec, stop = newEventRecorder(ctx, client)
	}
	ev := newNodeEvents(rec, node)
	if c.Mode == "" {
		ev.defaultMode()
	}
	if config.EffectiveMode(c) == config.ModeIPVS && ev.rec != nil {
		// Logged when the mode is set up (proxy.go), as upstream.
		ev.rec.Eventf(ev.ref, nil, v1.EventTypeWarning, reasonIPVSDeprecation, eventActionStart, ipvsDeprecation)
	}
	return rec, ev, stop
}

// nodeEvents records the start Events about this node. The zero value (no
// recorder: the file source) records nothing.
type nodeEvents struct {
	rec events.EventRecorder
	ref *v1.ObjectReference
}

func newNodeEvents(rec events.EventRecorder, node string) nodeEvents {
	return nodeEvents{rec: rec, ref: &v1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: node}}
}

// starting is upstream's "birth cry", once the proxy is set up.
func (e nodeEvents) starting() {
	if e.rec != nil {
		e.rec.Eventf(e.ref, nil, v1.EventTypeNormal, reasonStarting, eventActionStart, "")
	}
}

// defaultMode warns that the mode was not configured.
func (e nodeEvents) defaultMode() {
	klog.ErrorS(nil, defaultModeMessage)
	if e.rec != nil {
		e.rec.Eventf(e.ref, nil, v1.EventTypeWarning, reasonDefaultMode, eventActionStart, defaultModeMessage)
	}
}

// serverFailed records that the healthz or metrics server stopped kproxy.
func (e nodeEvents) serverFailed(reason string, err error) {
	if e.rec != nil && err != nil {
		e.rec.Eventf(e.ref, nil, v1.EventTypeWarning, reason, eventActionStart, err.Error())
	}
}
