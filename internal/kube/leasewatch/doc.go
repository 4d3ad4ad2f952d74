// Package leasewatch runs a controller only while its process holds a
// leader-election Lease (Run), and stops it the moment the Lease may be
// someone else's.
//
// client-go's elector gives up leading only after the renew deadline of
// failed renewals, counted from when it runs again: a process paused past
// the lease duration (SIGSTOP, a frozen VM) would otherwise wake up and act
// for that long beside the new leader. So the Lease lock remembers when
// this replica last took or renewed the Lease, a watchdog cancels the
// controllers' context once that is a lease duration ago, and the same
// check rides in the context for kube.StillLeading, which the controllers
// call right before each action that cannot be undone. On a signal the
// controllers stop first and the Lease is released after, so another
// replica takes over at once without a moment with two leaders.
//
// Health watches the renewals for a health check.
package leasewatch
