package nfttest

import (
	"context"
	"errors"
	"sync"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

// Watcher is a fake nft.Watcher: tests Send batches of events (as one
// netlink datagram would carry them) and Fail it.
type Watcher struct {
	ch     chan []nft.Event
	mu     sync.Mutex
	err    error
	failed chan struct{}
	once   sync.Once
}

var _ nft.Watcher = (*Watcher)(nil)

// NewWatcher returns a fake watcher that buffers up to 64 batches.
func NewWatcher() *Watcher {
	return &Watcher{ch: make(chan []nft.Event, 64), failed: make(chan struct{})}
}

// Send delivers one batch of events to Watch.
func (w *Watcher) Send(evs ...nft.Event) { w.ch <- evs }

// Lose delivers the news that notifications were lost (ENOBUFS).
func (w *Watcher) Lose() { w.ch <- []nft.Event{{Lost: true, Kind: nft.KindUnknown}} }

// Fail makes Watch return err.
func (w *Watcher) Fail(err error) {
	w.mu.Lock()
	w.err = err
	w.mu.Unlock()
	w.once.Do(func() { close(w.failed) })
}

// Watch implements nft.Watcher.
func (w *Watcher) Watch(ctx context.Context, fn func([]nft.Event)) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.failed:
			w.mu.Lock()
			defer w.mu.Unlock()
			return w.err
		case evs := <-w.ch:
			fn(evs)
		}
	}
}

// Close implements nft.Watcher.
func (w *Watcher) Close() error {
	w.Fail(errors.New("nfttest: watcher closed"))
	return nil
}
