package kube

import (
	"errors"
	"time"

	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// Handlers are the event handlers one controller added to shared
// informers. A controller adds them when it starts acting (a standby
// replica's queues stay empty: adding a handler to a running informer
// replays its cache) and removes them when it stops, since the informers
// outlive it.
type Handlers struct {
	regs []registration
}

type registration struct {
	inf cache.SharedIndexInformer
	reg cache.ResourceEventHandlerRegistration
}

// Add adds h to inf, with resync as its own resync period (zero: the
// informer's).
func (hs *Handlers) Add(inf cache.SharedIndexInformer, h cache.ResourceEventHandler, resync time.Duration) error {
	var reg cache.ResourceEventHandlerRegistration
	var err error
	if resync > 0 {
		reg, err = inf.AddEventHandlerWithResyncPeriod(h, resync)
	} else {
		reg, err = inf.AddEventHandler(h)
	}
	if err != nil {
		return err
	}
	hs.regs = append(hs.regs, registration{inf: inf, reg: reg})
	return nil
}

// Synced are the HasSynced funcs of the handlers, for
// cache.WaitForNamedCacheSync.
func (hs *Handlers) Synced() []cache.InformerSynced {
	out := make([]cache.InformerSynced, 0, len(hs.regs))
	for _, r := range hs.regs {
		out = append(out, r.reg.HasSynced)
	}
	return out
}

// Remove removes every handler added so far; an informer that already
// stopped is not an error worth more than a V(4) line.
func (hs *Handlers) Remove(logger klog.Logger) {
	var errs []error
	for _, r := range hs.regs {
		errs = append(errs, r.inf.RemoveEventHandler(r.reg))
	}
	hs.regs = nil
	if err := errors.Join(errs...); err != nil {
		logger.V(4).Info("Could not remove event handlers", "err", err.Error())
	}
}

// Tombstoned returns the object a delete event is about: the last known
// state inside a cache.DeletedFinalStateUnknown (a delete the watch missed),
// else obj itself.
func Tombstoned(obj any) any {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return obj
}
