package modify

import (
	"context"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/pkg/csiclient"
)

// CSI is the part of a driver connection the modify controller uses;
// *csiclient.Client implements it.
type CSI interface {
	kube.ClaimDriver
	// ControllerModifyVolume applies mutable parameters to a volume. Errors
	// keep their gRPC status. Asked only of drivers with MODIFY_VOLUME.
	ControllerModifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error)
}

// Config is what New needs.
type Config struct {
	// ClaimConfig is what the resize controller is given too. Only claims
	// bound to PersistentVolumes of DriverName, and VolumeAttributesClasses
	// whose driverName is DriverName, are acted on. RetryIntervalMax is
	// also how long an infeasible modification waits before the driver is
	// asked again with the same class (upstream's slow set).
	kube.ClaimConfig
	// CSI is the driver connection.
	CSI CSI
	// ExtraModifyMetadata adds the claim's name and namespace and the
	// volume's name to the mutable parameters (--extra-modify-metadata).
	ExtraModifyMetadata bool
	// ProbeAPI: before acting, check that the API server serves
	// VolumeAttributesClasses (storage.k8s.io/v1), and stay idle if it does
	// not. Upstream does so when the VolumeAttributesClass feature gate is
	// not set explicitly.
	ProbeAPI bool
}

// Validate reports the first field of c that cannot work.
func (c Config) Validate() error { return c.ClaimConfig.Validate(c.CSI) }

// Controller is the VolumeAttributesClass modify controller: a drop-in
// for the upstream external-resizer's (pkg/modifycontroller). Build it with
// New, start it with Run.
//
// For every bound claim of the driver whose spec.volumeAttributesClassName
// differs from status.currentVolumeAttributesClassName (or that has a
// modifyVolumeStatus), it reads the class and:
//
//   - the class does not exist: status.modifyVolumeStatus Pending, Event
//     VolumeModifyFailed; the class's creation queues the claim again;
//   - else it records InProgress with the class as the target (condition
//     ModifyingVolume, Event VolumeModify) before it calls
//     ControllerModifyVolume with the class's parameters as
//     mutable_parameters;
//   - success: the PersistentVolume's spec.volumeAttributesClassName, then
//     the claim's status.currentVolumeAttributesClassName are the class,
//     modifyVolumeStatus and the modify conditions go; Event
//     VolumeModifySuccessful;
//   - INVALID_ARGUMENT: Infeasible, condition ModifyVolumeError with the
//     driver's code and message, Event VolumeModifyFailed; the driver is
//     asked again with the same class only after RetryIntervalMax (or at
//     once when the claim's class changes);
//   - any other final error (FAILED_PRECONDITION, OUT_OF_RANGE, ...): still
//     InProgress with ModifyVolumeError, retried with backoff; the claim may
//     change its class meanwhile;
//   - an error whose outcome is uncertain (a timeout, ABORTED, ...): the
//     same, but the controller keeps the target until the driver answers
//     for certain, whatever the claim's class says meanwhile (the driver
//     may still be applying it). After a restart, every claim found
//     InProgress counts as uncertain.
//
// A claim whose class was set back to none before anything was applied is
// "rolled back": the ModifyingVolume condition goes, Event
// VolumeModifyCanceled.
type Controller struct {
	cfg Config

	vacInformer cache.SharedIndexInformer
	vacLister   storagelisters.VolumeAttributesClassLister

	// claims is the work loop, the caches and the record of the
	// controller's own writes, as the resize controller has its own.
	claims *kube.ClaimQueue
	mods   *modifyState
}

// New builds a modify controller over the shared informers. It adds no
// event handlers: Run does, so that a replica waiting for its Lease keeps
// a warm cache and an empty queue.
func New(cfg Config) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("modify controller: %w", err)
	}
	c := &Controller{cfg: cfg, mods: newModifyState()}
	claims, err := kube.NewClaimQueue(kube.ClaimQueueConfig{
		ClaimConfig: cfg.ClaimConfig, Controller: "modify", Name: QueueName(cfg.DriverName), EventComponent: EventComponent(cfg.DriverName),
		Metrics: metricNames, Ready: cfg.CSI.WaitReady, Sync: c.sync, Wants: c.shouldEnqueue,
		Forget: func(key string, _ *corev1.PersistentVolumeClaim) { c.mods.drop(key) },
	})
	if err != nil {
		return nil, err
	}
	c.claims = claims
	c.vacInformer = cfg.Informers.VolumeAttributesClasses()
	c.vacLister = storagelisters.NewVolumeAttributesClassLister(c.vacInformer.GetIndexer())
	return c, nil
}

// Run adds the event handlers, waits for the caches, runs the workers until
// ctx ends, then waits for them to finish their current claim. It returns
// nil when ctx ends (or at once when ProbeAPI finds no
// VolumeAttributesClass API), and an error only when it could not start.
func (c *Controller) Run(ctx context.Context) error {
	if c.cfg.ProbeAPI && !c.apiServed(ctx) {
		c.claims.Queue.ShutDown()
		return nil
	}
	klog.FromContext(ctx).Info("Starting the modify controller", "driver", c.cfg.DriverName, "workers", c.cfg.Workers,
		"queue", c.claims.Queue.Name, "extraModifyMetadata", c.cfg.ExtraModifyMetadata)
	return c.claims.Run(ctx, c.addClassHandler, c.initUncertain)
}

// apiServed tells whether the API server serves VolumeAttributesClasses.
// Only a NotFound says no: any other failure leaves the controller on, as
// upstream's discovery probe does, since the informer then waits for the
// API server anyway.
func (c *Controller) apiServed(ctx context.Context) bool {
	logger := klog.FromContext(ctx)
	_, err := c.cfg.Client.StorageV1().VolumeAttributesClasses().List(ctx, metav1.ListOptions{Limit: 1})
	switch {
	case err == nil:
		return true
	case apierrors.IsNotFound(err):
		logger.Info("The API server does not serve VolumeAttributesClasses (storage.k8s.io/v1): the modify controller stays off; --feature-gates=VolumeAttributesClass=false says so without the probe")
		return false
	}
	logger.Error(err, "Could not check whether the API server serves VolumeAttributesClasses; starting the modify controller anyway")
	return true
}

// initUncertain marks every claim whose modification is InProgress as
// uncertain: a previous run may have called the driver without seeing the
// answer, so its target is kept until the driver answers for certain.
func (c *Controller) initUncertain(logger klog.Logger) {
	claims, err := c.claims.PVCs.List(labels.Everything())
	if err != nil {
		logger.Error(err, "Listing the cached claims for modifications in progress failed")
		return
	}
	for _, pvc := range claims {
		if s := pvc.Status.ModifyVolumeStatus; s != nil && s.Status == corev1.PersistentVolumeClaimModifyVolumeInProgress {
			c.mods.setUncertain(kube.ClaimKey(pvc), true)
		}
	}
}

var _ CSI = (*csiclient.Client)(nil)
