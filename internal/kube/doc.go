// Package kube is what every controller of loopvol's sidecar shares: the
// narrow Kubernetes client, informers built once per process and handed to
// each controller that needs them (with cache transforms that keep the union
// of the fields their consumers read), the rate-limited work queue with its
// one error-handling path, the upstream name sanitizer and JSON patches with
// test operations.
//
// It is also the controllers' toolkit, so that each thing they all do is
// written once: RetryStale is the one "patch, read again, retry once" loop;
// Writes is the one record of a controller's own writes (a stale cache, the
// echo of its own write, an event held during a sync); ReadSecret is the one
// read of a CSI call's Secret and VolumeCapability the one derivation of a
// PersistentVolume's CSI capability; ValidateController, Every and
// Queue.ProcessNext are the settings check, the periodic pass and the worker
// step every controller uses. ClaimQueue (with ClaimConfig, the claim
// status and live-volume reads and patches, the node-affinity check and
// ClaimMetrics) is what the two claim controllers, pkg/resize and
// pkg/modify, run on. Package kubetest, next to it, is the fake API server
// and fixture parts their tests share; claimtest the claim controllers'
// fixture built on it; leasewatch the Lease watchdog that runs a controller
// only while its process leads.
//
// The sidecar runs several controllers in one process (attach, capacity,
// resize, modify, registrar, webhook). Each still owns its queues, workers and metrics; what
// it must not own is a second watch of the same resource: two
// PersistentVolume informers would double the sidecar's largest cache and its
// API server load.
package kube
