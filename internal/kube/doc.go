// Package kube is what every controller of loopvol's sidecar shares: the
// narrow Kubernetes client, informers built once per process and handed to
// each controller that needs them (with cache transforms that keep the union
// of the fields their consumers read), the rate-limited work queue with its
// one error-handling path, the upstream name sanitizer and JSON patches with
// test operations.
//
// The sidecar runs several controllers in one process (attach, capacity,
// resizer, registrar). Each still owns its queues, workers and metrics; what
// it must not own is a second watch of the same resource: two
// PersistentVolume informers would double the sidecar's largest cache and its
// API server load.
package kube
