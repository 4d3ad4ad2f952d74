package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/loopvol/loopvol/pkg/pool"
)

func newVolumesCommand(run runner) *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "volumes",
		Short: "List loopvol's volumes: claim, PV, pool, node, mounts, health, snapshots",
		Long: "volumes lists one line per PersistentVolume of the driver whose claim is in the\n" +
			"namespace (-n, or the context's), or every one with -A: its claim, PV, volume ID and\n" +
			"pool, size, the node it is attached to, whether that node has it staged and in how\n" +
			"many Pods it is published, its health as the node plugin sees it, and its snapshots.",
		Args: cobra.NoArgs,
		RunE: run(func(ctx context.Context, e *env, _ []string) error {
			r, err := e.volumes(ctx, all)
			if err != nil {
				return err
			}
			if ok, err := printObject(e.out, e.opts.output, r); ok {
				return err
			}
			r.write(e, all)
			return nil
		}),
	}
	cmd.Flags().BoolVarP(&all, "all-namespaces", "A", false, "List the volumes of claims in every namespace, and PVs without a claim.")
	return cmd
}

// VolumesReport is what volumes shows.
type VolumesReport struct {
	Volumes []VolumeReport `json:"volumes"`
}

// VolumeReport is one volume of the driver.
type VolumeReport struct {
	// Namespace and Claim name the PV's claim; empty when it has none.
	Namespace     string `json:"namespace,omitempty"`
	Claim         string `json:"claim,omitempty"`
	PV            string `json:"pv"`
	Phase         string `json:"phase"`
	VolumeID      string `json:"volumeID"`
	Pool          string `json:"pool,omitempty"`
	CapacityBytes int64  `json:"capacityBytes"`
	// AllocatedBytes is what the volume's image holds on its pool now, as
	// the node that has it staged reports it (0 when none does).
	AllocatedBytes int64 `json:"allocatedBytes,omitempty"`
	// Node is the node a VolumeAttachment says it is attached to.
	Node string `json:"node,omitempty"`
	// StagedOn is the node whose plugin has it staged; TargetPaths are its
	// mounts into Pods there.
	StagedOn    string   `json:"stagedOn,omitempty"`
	TargetPaths []string `json:"targetPaths,omitempty"`
	Health      string   `json:"health,omitempty"`
	// Snapshots are its VolumeSnapshotContents; null when the snapshot
	// CRDs are not installed.
	Snapshots []string `json:"snapshots"`
}

func (e *env) volumes(ctx context.Context, all bool) (*VolumesReport, error) {
	pvs, err := e.driverVolumes(ctx)
	if err != nil {
		return nil, err
	}
	vas, err := e.attachments(ctx)
	if err != nil {
		return nil, err
	}
	snaps, err := e.snapshotsByVolume(ctx)
	if err != nil {
		return nil, err
	}
	c, err := e.gather(ctx, nil)
	if err != nil {
		return nil, err
	}
	r := &VolumesReport{Volumes: []VolumeReport{}}
	for _, pv := range pvs {
		ref := pv.Spec.ClaimRef
		if !all && (ref == nil || ref.Namespace != e.namespace) {
			continue
		}
		r.Volumes = append(r.Volumes, volumeReport(pv, vas[pv.Name], snaps, c))
	}
	slices.SortFunc(r.Volumes, func(a, b VolumeReport) int {
		return strings.Compare(a.Namespace+"/"+a.Claim+"/"+a.PV, b.Namespace+"/"+b.Claim+"/"+b.PV)
	})
	return r, nil
}

func volumeReport(pv *corev1.PersistentVolume, vas []*storagev1.VolumeAttachment, snaps map[string][]string, c *cluster) VolumeReport {
	handle := pv.Spec.CSI.VolumeHandle
	r := VolumeReport{PV: pv.Name, Phase: string(pv.Status.Phase), VolumeID: handle, Node: attachedNode(vas)}
	if ref := pv.Spec.ClaimRef; ref != nil {
		r.Namespace, r.Claim = ref.Namespace, ref.Name
	}
	if id, err := pool.ParseVolumeID(handle); err == nil {
		r.Pool = id.Pool
	}
	if q, ok := pv.Spec.Capacity[corev1.ResourceStorage]; ok {
		r.CapacityBytes = q.Value()
	}
	if n, v := c.volume(handle); v != nil {
		r.TargetPaths, r.Health, r.AllocatedBytes = v.TargetPaths, v.Health, v.AllocatedBytes
		if !v.Staged.IsZero() {
			r.StagedOn = n.name
		}
	}
	if snaps != nil {
		r.Snapshots = append([]string{}, snaps[handle]...)
	}
	return r
}

func (r *VolumesReport) write(e *env, all bool) {
	if len(r.Volumes) == 0 {
		if all {
			fmt.Fprintf(e.out, "No volumes of %s.\n", e.opts.driver)
		} else {
			fmt.Fprintf(e.out, "No volumes of %s in namespace %s.\n", e.opts.driver, e.namespace)
		}
		return
	}
	t := &table{header: []string{"CLAIM", "PV", "VOLUME", "SIZE", "ALLOC", "NODE", "MOUNTS", "HEALTH", "SNAP"}}
	for _, v := range r.Volumes {
		claim := v.Claim
		if all && v.Claim != "" {
			claim = v.Namespace + "/" + v.Claim
		}
		mounts := "-"
		switch {
		case v.StagedOn == "":
		case len(v.TargetPaths) == 0:
			mounts = "staged"
		default:
			mounts = strconv.Itoa(len(v.TargetPaths)) + pick(len(v.TargetPaths) == 1, " pod", " pods")
		}
		health := cell{text: orDash(v.Health), tone: pick(v.Health == "ok", good, bad), limit: 13}
		if v.Health == "" {
			health.tone = plain
		}
		snaps := "-"
		if v.Snapshots != nil {
			snaps = strconv.Itoa(len(v.Snapshots))
		}
		alloc := "-"
		if v.AllocatedBytes > 0 {
			alloc = bytesIEC(v.AllocatedBytes)
		}
		t.add(cut(orDash(claim), 18), cut(v.PV, 12), cut(v.VolumeID, 14), c(bytesIEC(v.CapacityBytes)), c(alloc),
			cut(orDash(v.Node), 10), c(mounts), health, c(snaps))
	}
	t.write(e.out, e.color)
}
