package claimtest

import (
	"context"
	"sync"

	"github.com/loopvol/loopvol/pkg/csiclient"
)

// FakeDriver is what the claim controllers' fake CSI drivers share: the
// capabilities they offer and the calls made to them, of type C (the
// controller's call in short form). A controller's fake embeds it, adds
// its own RPC, and appends each call to Calls with the mutex held.
type FakeDriver[C any] struct {
	sync.Mutex
	// Caps are the driver's capabilities; a test may change them.
	Caps csiclient.Capabilities
	// Calls are the calls made since the last TakeCalls.
	Calls []C
}

// WaitReady returns at once: the fake is always ready while ctx lasts.
func (d *FakeDriver[C]) WaitReady(ctx context.Context) error { return ctx.Err() }

// Capabilities returns Caps.
func (d *FakeDriver[C]) Capabilities() csiclient.Capabilities {
	d.Lock()
	defer d.Unlock()
	return d.Caps
}

// TakeCalls returns the calls made since the last TakeCalls, and forgets
// them.
func (d *FakeDriver[C]) TakeCalls() []C {
	d.Lock()
	defer d.Unlock()
	out := d.Calls
	d.Calls = nil
	return out
}
