// Package webhook is loopvol's validating admission webhook
// (--controllers=webhook of the sidecar): it refuses what the
// ValidatingAdmissionPolicies cannot see, because the answer depends on
// other objects or on the driver. A PersistentVolumeClaim of a loopvol
// class larger than any pool of the class can hold, an expansion that no
// pool of the volume's zone can hold, and a StorageClass whose pool no node
// serves are refused with the sizes in the message.
//
// It serves admission.k8s.io/v1 AdmissionReview over HTTPS at /validate.
// Claims are judged from informer caches only (CSIStorageCapacity objects
// of the capacity controller, StorageClasses, PersistentVolumes), never a
// request to the API server; a StorageClass costs one GetCapacity call to
// the driver. The serving certificate is re-read from its directory when
// the files change, and the caBundle of the webhook's own
// ValidatingWebhookConfiguration is kept equal to its CA.
package webhook
