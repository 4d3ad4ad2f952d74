// Package registrar is the sidecar's replacement for node-driver-registrar:
// it registers the CSI driver with kubelet's plugin watcher and, where no
// kubelet runs, does kubelet's part of the registration itself.
//
// Registration: the registrar serves kubelet's pluginregistration.v1 API
// (k8s.io/kubelet/pkg/apis/pluginregistration/v1) on
// <plugin registration dir>/<driver>-reg.sock. GetInfo answers type
// CSIPlugin, the driver's name, the driver socket's path as kubelet sees it
// and the supported versions ["1.0.0"]; NotifyRegistrationStatus is kubelet's
// verdict. Unlike upstream, nothing here exits the process: a failed
// registration is logged, reported by Healthy and retried by creating the
// socket again after an exponential backoff (kubelet registers a plugin when
// its socket appears); a socket that vanishes is created again at once; a
// socket that another process put in its place is left to it; the socket is
// made owner-only without touching the process's umask
// (internal/unixsock) and removed at the end only if it is still ours.
//
// Health: Healthy fails while the driver is unhealthy, while a GetInfo over
// the registration socket does not answer with the driver's name (what
// upstream's /healthz checks), and until kubelet has confirmed the
// registration on the current socket (ModeKubelet) or the CSINode entry is
// in place (ModeDirect).
//
// CSINode: in ModeKubelet kubelet owns the driver's entry in the node's
// CSINode (node ID, topology keys, allocatable.count) and the registrar
// never writes it; with an API client (another controller of the process
// has one) it only reads the entry after each registration and logs drift
// from NodeGetInfo. Without a client it never talks to the API server and
// needs no RBAC. In ModeDirect the registrar writes the entry as kubelet's
// node info manager would: it creates the CSINode owned by the Node, patches
// the entry when it drifts, reads NodeGetInfo again every
// CSIDriver.spec.nodeAllocatableUpdatePeriodSeconds and at once after an
// attach to the node fails with RESOURCE_EXHAUSTED, and never touches
// another driver's entry.
package registrar
