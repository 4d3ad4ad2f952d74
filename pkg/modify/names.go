package modify

// Names of the modify controller shared with Kubernetes and the upstream
// external-resizer.
const (
	// Reasons of the Events recorded on claims, upstream's.
	ReasonModify          = "VolumeModify"
	ReasonModifyFailed    = "VolumeModifyFailed"
	ReasonModifySucceeded = "VolumeModifySuccessful"
	ReasonModifyCancelled = "VolumeModifyCanceled"

	// SecretNameAnnotation and SecretNamespaceAnnotation on a
	// PersistentVolume name the Secret whose data is the secrets of
	// ControllerModifyVolume; external-provisioner sets them from the
	// StorageClass parameters csi.storage.k8s.io/controller-modify-secret-name
	// and -namespace. Without them the volume's controllerExpandSecretRef is
	// used, as upstream does.
	SecretNameAnnotation      = "volume.kubernetes.io/controller-modify-secret-name"
	SecretNamespaceAnnotation = "volume.kubernetes.io/controller-modify-secret-namespace"

	// The mutable parameters --extra-modify-metadata adds.
	ParameterPVCName      = "csi.storage.k8s.io/pvc/name"
	ParameterPVCNamespace = "csi.storage.k8s.io/pvc/namespace"
	ParameterPVName       = "csi.storage.k8s.io/pv/name"
)

// QueueName is the name of the modify controller's work queue in the
// workqueue metrics: "<driver name>-pvc-modify". Upstream names it
// "<driver name>-pvc" like the resize queue; two queues of one name would
// share (and overwrite) each other's gauges in one process.
func QueueName(driver string) string { return driver + "-pvc-modify" }

// EventComponent is the source component of the Events the controller
// records when Config.Recorder is nil: "external-resizer <driver name>",
// upstream's, whose one binary runs the resize and the modify controllers
// (resize.EventComponent is the same).
func EventComponent(driver string) string { return "external-resizer " + driver }
