package attach

import (
	"context"
	"errors"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/pkg/csiclient"
)

// purpose says what a resolve is for; it decides which checks apply and
// where the node ID comes from first.
type purpose int

const (
	forAttach purpose = iota
	forDetach
	forReconcile
)

// target is everything a CSI call about one VolumeAttachment needs, worked
// out in one place (resolve) for attach, detach and reconcile.
type target struct {
	// pv is the PersistentVolume, nil for an inline volume.
	pv         *corev1.PersistentVolume
	handle     string
	readOnly   bool
	attributes map[string]string
	// capability is set for attach only.
	capability *csi.VolumeCapability
	secretRef  *corev1.SecretReference
	nodeID     string
}

// permanent and isFinal are the shared sync-error classification
// (kube.Permanent, kube.IsFinal).
var (
	permanent = kube.Permanent
	isFinal   = kube.IsFinal
)

// resolve works out the volume, its capability, readonly flag, publish
// secret reference and the node's CSI node ID of va.
func (c *Controller) resolve(ctx context.Context, va *storagev1.VolumeAttachment, caps csiclient.Capabilities, p purpose) (*target, error) {
	spec, pv, err := c.volumeSpec(ctx, va, p)
	if err != nil {
		return nil, err
	}
	src := spec.CSI
	if src == nil {
		if pv != nil {
			return nil, permanent(fmt.Errorf("PersistentVolume %q has no CSI source", pv.Name))
		}
		return nil, permanent(errors.New("the inline volume spec has no CSI source"))
	}
	if src.VolumeHandle == "" {
		return nil, permanent(errors.New("the CSI source has an empty volumeHandle"))
	}
	t := &target{
		pv:         pv,
		handle:     src.VolumeHandle,
		readOnly:   src.ReadOnly && caps.PublishReadOnly, // CSI: false unless PUBLISH_READONLY
		attributes: src.VolumeAttributes,
		secretRef:  src.ControllerPublishSecretRef,
	}
	if p == forAttach {
		if pv != nil && pv.DeletionTimestamp != nil {
			return nil, permanent(fmt.Errorf("PersistentVolume %q is marked for deletion", pv.Name))
		}
		if t.capability, err = kube.VolumeCapability(spec, caps.SingleNodeMultiWriter, c.cfg.DefaultFSType); err != nil {
			return nil, permanent(err)
		}
	}
	if t.nodeID, err = c.nodeID(ctx, va, p); err != nil {
		return nil, err
	}
	return t, nil
}

// volumeSpec returns the PersistentVolumeSpec of va: its PersistentVolume's
// (with the PersistentVolume) or its inline one. A PersistentVolume the
// cache does not know yet is read from the API server (it may have been
// created just before the VolumeAttachment), except by the reconcile.
func (c *Controller) volumeSpec(ctx context.Context, va *storagev1.VolumeAttachment, p purpose) (*corev1.PersistentVolumeSpec, *corev1.PersistentVolume, error) {
	src := va.Spec.Source
	switch {
	case src.PersistentVolumeName != nil && src.InlineVolumeSpec != nil:
		return nil, nil, permanent(errors.New("the source names both a PersistentVolume and an inline volume"))
	case src.InlineVolumeSpec != nil:
		return src.InlineVolumeSpec, nil, nil
	case src.PersistentVolumeName == nil:
		return nil, nil, permanent(errors.New("the source names neither a PersistentVolume nor an inline volume"))
	}
	name := *src.PersistentVolumeName
	pv, err := c.pvLister.Get(name)
	if apierrors.IsNotFound(err) && p != forReconcile {
		pv, err = c.client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return nil, nil, fmt.Errorf("get PersistentVolume %q: %w", name, err)
	}
	return &pv.Spec, pv, nil
}

// nodeID returns the CSI node ID of va's node. An attach asks the node's
// CSINode first (the node may have registered again under a new ID), then
// the node-ID annotation, then the API server in case the cache lags. A
// detach and the reconcile ask the annotation first: it records the ID the
// volume was published to, and it still works when the node and its CSINode
// are gone.
func (c *Controller) nodeID(ctx context.Context, va *storagev1.VolumeAttachment, p purpose) (string, error) {
	fromCSINode := func() (string, bool) {
		n, err := c.csiNodeLister.Get(va.Spec.NodeName)
		if err != nil {
			return "", false
		}
		return nodeIDFromCSINode(n, c.cfg.DriverName)
	}
	annotated, hasAnnotation := va.Annotations[NodeIDAnnotation]
	hasAnnotation = hasAnnotation && annotated != ""
	if p != forAttach && hasAnnotation {
		return annotated, nil
	}
	if id, ok := fromCSINode(); ok {
		return id, nil
	}
	if hasAnnotation {
		return annotated, nil
	}
	if p == forAttach {
		n, err := c.client.StorageV1().CSINodes().Get(ctx, va.Spec.NodeName, metav1.GetOptions{})
		if err == nil {
			if id, ok := nodeIDFromCSINode(n, c.cfg.DriverName); ok {
				return id, nil
			}
		} else if !apierrors.IsNotFound(err) {
			return "", fmt.Errorf("get CSINode %q: %w", va.Spec.NodeName, err)
		}
	}
	return "", fmt.Errorf("the CSI node ID of node %q is unknown: its CSINode does not list driver %q and the VolumeAttachment has no %s annotation",
		va.Spec.NodeName, c.cfg.DriverName, NodeIDAnnotation)
}

// nodeIDFromCSINode returns the node ID n gives driver, if any.
func nodeIDFromCSINode(n *storagev1.CSINode, driver string) (string, bool) {
	for _, d := range n.Spec.Drivers {
		if d.Name == driver && d.NodeID != "" {
			return d.NodeID, true
		}
	}
	return "", false
}

// publishSecrets reads the controllerPublishSecretRef Secret, when there
// is one (kube.ReadSecret: never cached, watched or logged).
func (c *Controller) publishSecrets(ctx context.Context, ref *corev1.SecretReference) (map[string]string, error) {
	return kube.ReadSecret(ctx, c.client, ref, "controllerPublishSecretRef")
}
