// Package heartbeat is the liveness signal that fencing (issue 26) rests
// on: a node is fenced (its shared-pool volumes taken from it at the
// storage level) only when it is known not to be serving.
//
// Each node plugin runs a Renewer, which keeps one coordination.k8s.io/v1
// Lease per driver and node (LeaseName) renewed every RenewInterval over
// the network. A node cut off from the API server cannot renew it, even
// when it can still write the shared pool: that is why the heartbeat is a
// Lease and not a file in the pool. When no renewal has succeeded for
// SelfFenceAfter, the Renewer calls OnLost, and the node plugin stops the
// I/O of its shared-pool volumes itself; when a renewal succeeds again it
// calls OnRegained.
//
// The leader-elected sidecar runs an Observer, which watches the Leases of
// one driver and reports a node stale once it has not seen that node's
// Lease change for the fencing period. Times are measured on the
// Observer's own clock from the moment it saw a change, never from the
// renewTime written in the object: two machines' clocks differ, and after
// an API outage every Lease looks old. Observation must be continuous:
// when the watch or a periodic probe of the API server fails, nobody turns
// stale, and once both work again every node's countdown starts afresh, so
// an outage (or a new leader, whose Observer starts from nothing) never
// makes a live node look stale.
//
// The safety argument. Let b be the moment a renewal that succeeded began,
// on the node. Its write reached the API server after b, and the Observer
// saw it after that, so the Observer cannot call the node stale before
// b + FencingPeriod. The node calls OnLost at b + SelfFenceAfter unless a
// later renewal succeeded; OnLost then needs up to SelfFenceMargin to stop
// the I/O. RenewerConfig.Validate requires
//
//	SelfFenceAfter + RenewInterval + SelfFenceMargin <= FencingPeriod
//
// (one more RenewInterval of slack for a timer that fires late on a loaded
// node), so a live node has stopped its I/O before anyone may fence it. A
// renewal whose answer was lost but whose write landed only moves the
// Observer's countdown later. The Lease carries the fencing period
// (spec.leaseDurationSeconds, rounded up), and the Observer never uses a
// shorter one than a Lease says. Neither side reads the other's clock:
// each measures elapsed time on its own, and clock rates differ by parts
// per million, well inside the margin.
//
// What the heartbeat cannot know: a process that is not running (a node
// plugin between a crash and its restart, a frozen node) renews nothing
// and calls nothing, while the kernel's loop devices may keep writing.
// That is what the storage-level fence is for, and why the Lease carries
// the node plugin's incarnation: a restarted node plugin must find out
// whether it was fenced meanwhile before it serves again.
package heartbeat
