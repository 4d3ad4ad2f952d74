package attach

import (
	"context"
	"time"

	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/pkg/csiclient"
	"google.golang.org/grpc/codes"
)

// callContext returns the context of one driver call for the
// VolumeAttachment key, and its timeout: Config.Timeout, or longer when
// the previous call of key timed out (zero when Config.Timeout is zero:
// the connection's own timeout applies).
func (c *Controller) callContext(ctx context.Context, key string) (context.Context, time.Duration) {
	if c.cfg.Timeout <= 0 {
		return ctx, 0
	}
	d := c.state.callTimeout(key, c.cfg.Timeout)
	return csiclient.WithTimeout(ctx, d), d
}

// noteCallResult adjusts the timeout of key's next driver call after a
// call that took timeout ended with err: after a timeout it doubles (up to
// TimeoutGrowthLimit × Config.Timeout), after any answer of the driver it
// is Config.Timeout again. A driver whose calls are slower than --timeout
// would otherwise never finish one: each try is cut off, and the next
// starts over. The first timeout is logged at level 0, once per process,
// with what to do about it; later ones at level 2.
func (c *Controller) noteCallResult(ctx context.Context, key, method string, timeout time.Duration, err error) {
	if timeout == 0 {
		return
	}
	code, _ := csiclient.Code(err)
	if code != codes.DeadlineExceeded || ctx.Err() != nil {
		if err == nil || code != codes.Canceled {
			c.state.setCallTimeout(key, c.cfg.Timeout, c.cfg.Timeout)
		}
		return
	}
	c.metrics.callTimeouts.WithLabelValues(method).Inc()
	limit := TimeoutGrowthLimit * c.cfg.Timeout
	next := min(2*timeout, limit)
	c.state.setCallTimeout(key, next, c.cfg.Timeout)
	logger := klog.FromContext(ctx)
	if c.timeoutLogged.CompareAndSwap(false, true) {
		logger.Info("The driver took longer than the call timeout (--timeout); each VolumeAttachment whose call timed out gets twice as long at its next try, up to the limit. "+
			"If the driver is this slow in general, raise --timeout",
			"method", method, "timeout", timeout, "nextTimeout", next, "limit", limit)
		return
	}
	logger.V(2).Info("Driver call timed out; the next try gets longer", "method", method, "timeout", timeout, "nextTimeout", next)
}
