// Package source defines where cluster state comes from. A Source feeds
// Services, EndpointSlices and this node's Node into a model.EventHandler:
// subpackage apiserver watches the Kubernetes API with informers, subpackage
// file reads objects as `kubectl get -o yaml` writes them and watches the
// files for changes.
package source

import (
	"context"

	"github.com/kproxy/kproxy/internal/model"
)

// Source delivers cluster state to an EventHandler.
//
// Run first delivers the initial state (every object as an Updated event),
// then calls h.Synced() exactly once, then keeps delivering changes until
// ctx is done. Calls to h are never concurrent, and none happens after Run
// has returned. Run returns nil when ctx ends after a successful start, and
// an error when it cannot start (or ctx ends before the initial state was
// delivered, in which case Synced is not called).
type Source interface {
	Run(ctx context.Context, h model.EventHandler) error
}
