// Package kubetest is the fake Kubernetes API the controllers' unit tests
// share, next to the client code it fakes (as pkg/loop/looptest is next
// to pkg/loop): Serve makes a fake clientset hand out resourceVersions
// and honour resourceVersion preconditions as a real API server does, a
// Recorder lists the requests a controller made in a form a test writes
// out in full, and Events, Diff and Get are the small helpers every
// fixture needs.
//
// A controller's own fixture stays in its package: which caches it fills,
// which handlers a replayed watch calls and how its queues are drained
// are its own. Only what every fixture did alike is here.
package kubetest
