package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"

	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/statusapi"
)

// eventsPerObject is how many of each object's last Events describe shows.
const eventsPerObject = 5

func newDescribeCommand(run runner) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "describe (pvc|pv|pod) NAME",
		Short: "Show the whole path of a claim, and what it waits for",
		Long: "describe follows one claim (pvc NAME in the namespace, the claim of pv NAME, or every\n" +
			"loopvol claim of pod NAME) from its class through its PV and volume ID, pool and image,\n" +
			"VolumeAttachment, node, loop device and mounts, to the Pods that use it, with the last\n" +
			"Events of every object on the way and the driver's record from the node plugin. When\n" +
			"something waits, the line Waiting: says for what.",
		Example: "  kubectl loopvol describe pvc data-web-0 -n default\n" +
			"  kubectl loopvol describe pv pvc-6b1e2f3a-4c5d-4e6f-8a9b-0c1d2e3f4a5b\n" +
			"  kubectl loopvol describe pod web-0 -o yaml",
		Args:      cobra.ExactArgs(2),
		ValidArgs: []string{"pvc", "pv", "pod"},
		RunE: run(func(ctx context.Context, e *env, args []string) error {
			r, err := e.describe(ctx, args[0], args[1])
			if err != nil {
				return err
			}
			if ok, err := printObject(e.out, e.opts.output, r); ok {
				return err
			}
			r.write(e)
			return nil
		}),
	}
	return cmd
}

// DescribeReport is what describe shows: the Pod, for describe pod, and
// the path of each claim.
type DescribeReport struct {
	Pod    *PodRef     `json:"pod,omitempty"`
	Claims []ClaimPath `json:"claims"`
}

// PodRef is a Pod and why it is not running, when it is not.
type PodRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Node      string `json:"node,omitempty"`
	Phase     string `json:"phase"`
	// Reason is a waiting container's reason (ContainerCreating …).
	Reason string `json:"reason,omitempty"`
}

// ClaimPath is one claim from its class to its mounts.
type ClaimPath struct {
	// Namespace and Claim are empty for a PV without a claim.
	Namespace   string `json:"namespace,omitempty"`
	Claim       string `json:"claim,omitempty"`
	Phase       string `json:"phase,omitempty"`
	Class       string `json:"class,omitempty"`
	BindingMode string `json:"bindingMode,omitempty"`
	Requested   string `json:"requested,omitempty"`
	// SelectedNode is the scheduler's choice for a WaitForFirstConsumer claim.
	SelectedNode  string                  `json:"selectedNode,omitempty"`
	PV            string                  `json:"pv,omitempty"`
	PVPhase       string                  `json:"pvPhase,omitempty"`
	CapacityBytes int64                   `json:"capacityBytes,omitempty"`
	VolumeID      string                  `json:"volumeID,omitempty"`
	Pool          string                  `json:"pool,omitempty"`
	Attachments   []AttachmentReport      `json:"attachments,omitempty"`
	Node          string                  `json:"node,omitempty"`
	Record        *statusapi.VolumeStatus `json:"record,omitempty"`
	// NodeError says why the node plugin's record could not be read.
	NodeError string        `json:"nodeError,omitempty"`
	Pods      []PodRef      `json:"pods,omitempty"`
	Snapshots []string      `json:"snapshots"`
	Waiting   string        `json:"waiting,omitempty"`
	Events    []EventReport `json:"events,omitempty"`
}

// AttachmentReport is a VolumeAttachment of the volume.
type AttachmentReport struct {
	Name        string `json:"name"`
	Node        string `json:"node"`
	Attached    bool   `json:"attached"`
	AttachError string `json:"attachError,omitempty"`
	DetachError string `json:"detachError,omitempty"`
}

// EventReport is one Event of an object on the claim's path.
type EventReport struct {
	Object   string      `json:"object"`
	Type     string      `json:"type"`
	Reason   string      `json:"reason"`
	Message  string      `json:"message"`
	Count    int32       `json:"count,omitempty"`
	LastSeen metav1.Time `json:"lastSeen"`
}

func (e *env) describe(ctx context.Context, kind, name string) (*DescribeReport, error) {
	switch kind {
	case "pvc", "persistentvolumeclaim", "persistentvolumeclaims":
		pvc, err := e.kube.CoreV1().PersistentVolumeClaims(e.namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		p, err := e.claimPath(ctx, pvc, nil)
		if err != nil {
			return nil, err
		}
		return &DescribeReport{Claims: []ClaimPath{*p}}, nil
	case "pv", "persistentvolume", "persistentvolumes":
		pv, err := e.kube.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		if !e.isOurs(pv) {
			return nil, fmt.Errorf("PersistentVolume %s is not a volume of %s", name, e.opts.driver)
		}
		var pvc *corev1.PersistentVolumeClaim
		if ref := pv.Spec.ClaimRef; ref != nil {
			pvc, err = e.kube.CoreV1().PersistentVolumeClaims(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
			if err = ignoreNotFound(err); err != nil {
				return nil, err
			}
		}
		p, err := e.claimPath(ctx, pvc, pv)
		if err != nil {
			return nil, err
		}
		return &DescribeReport{Claims: []ClaimPath{*p}}, nil
	case "pod", "pods", "po":
		return e.describePod(ctx, name)
	}
	return nil, fmt.Errorf("describe %q: want pvc, pv or pod", kind)
}

func (e *env) describePod(ctx context.Context, name string) (*DescribeReport, error) {
	p, err := e.kube.CoreV1().Pods(e.namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	r := &DescribeReport{Pod: podRef(p), Claims: []ClaimPath{}}
	for _, claimName := range podClaims(p) {
		pvc, err := e.kube.CoreV1().PersistentVolumeClaims(p.Namespace).Get(ctx, claimName, metav1.GetOptions{})
		if err != nil {
			if err = ignoreNotFound(err); err != nil {
				return nil, err
			}
			r.Claims = append(r.Claims, ClaimPath{Namespace: p.Namespace, Claim: claimName, Snapshots: []string{},
				Waiting: "for claim " + claimName + ", which does not exist"})
			continue
		}
		ours, err := e.claimIsOurs(ctx, pvc)
		if err != nil {
			return nil, err
		}
		if !ours {
			continue
		}
		cp, err := e.claimPath(ctx, pvc, nil)
		if err != nil {
			return nil, err
		}
		r.Claims = append(r.Claims, *cp)
	}
	return r, nil
}

// podClaims are the names of the claims a Pod's volumes use, generic
// ephemeral volumes' included (named <pod>-<volume>).
func podClaims(p *corev1.Pod) []string {
	var out []string
	for _, v := range p.Spec.Volumes {
		switch {
		case v.PersistentVolumeClaim != nil:
			out = append(out, v.PersistentVolumeClaim.ClaimName)
		case v.Ephemeral != nil:
			out = append(out, p.Name+"-"+v.Name)
		}
	}
	return out
}

// claimIsOurs says whether the claim's PV, or while it has none its
// class, belongs to the driver.
func (e *env) claimIsOurs(ctx context.Context, pvc *corev1.PersistentVolumeClaim) (bool, error) {
	if pvc.Spec.VolumeName != "" {
		pv, err := e.kube.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
		if err == nil {
			return e.isOurs(pv), nil
		}
		if err = ignoreNotFound(err); err != nil {
			return false, err
		}
	}
	if pvc.Spec.StorageClassName == nil {
		return false, nil
	}
	sc, err := e.kube.StorageV1().StorageClasses().Get(ctx, *pvc.Spec.StorageClassName, metav1.GetOptions{})
	if err != nil {
		return false, ignoreNotFound(err)
	}
	return sc.Provisioner == e.opts.driver, nil
}

func podRef(p *corev1.Pod) *PodRef {
	r := &PodRef{Namespace: p.Namespace, Name: p.Name, Node: p.Spec.NodeName, Phase: string(p.Status.Phase)}
	for _, cs := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
		if cs.State.Waiting != nil && cs.State.Waiting.Reason != "" {
			r.Reason = cs.State.Waiting.Reason
			break
		}
	}
	return r
}

// pathObjects is what claimPath read, kept for the Waiting line.
type pathObjects struct {
	pvc   *corev1.PersistentVolumeClaim
	class *storagev1.StorageClass
	pv    *corev1.PersistentVolume
	vas   []*storagev1.VolumeAttachment
	pods  []*corev1.Pod
	// events are every object's, oldest first.
	events []corev1.Event
	node   *nodeView
}

// claimPath follows pvc, or pv when pvc is nil, to its node and Pods.
func (e *env) claimPath(ctx context.Context, pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) (*ClaimPath, error) {
	o := &pathObjects{pvc: pvc, pv: pv}
	r := &ClaimPath{Snapshots: []string{}}
	if pvc != nil {
		r.Namespace, r.Claim, r.Phase = pvc.Namespace, pvc.Name, string(pvc.Status.Phase)
		r.SelectedNode = pvc.Annotations["volume.kubernetes.io/selected-node"]
		if q, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; ok {
			r.Requested = q.String()
		}
		if pvc.Spec.StorageClassName != nil {
			r.Class = *pvc.Spec.StorageClassName
			sc, err := e.kube.StorageV1().StorageClasses().Get(ctx, r.Class, metav1.GetOptions{})
			if err = ignoreNotFound(err); err != nil {
				return nil, err
			}
			if sc != nil && sc.Name != "" {
				o.class = sc
				if sc.VolumeBindingMode != nil {
					r.BindingMode = string(*sc.VolumeBindingMode)
				}
			}
		}
		if pvc.Spec.VolumeName != "" && pv == nil {
			got, err := e.kube.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
			if err = ignoreNotFound(err); err != nil {
				return nil, err
			}
			if err == nil && got.Name != "" {
				o.pv = got
			}
		}
		pods, err := e.kube.CoreV1().Pods(pvc.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("list Pods in %s: %w", pvc.Namespace, err)
		}
		for i := range pods.Items {
			if slices.Contains(podClaims(&pods.Items[i]), pvc.Name) {
				o.pods = append(o.pods, &pods.Items[i])
				r.Pods = append(r.Pods, *podRef(&pods.Items[i]))
			}
		}
	}
	if o.pv != nil {
		r.PV, r.PVPhase = o.pv.Name, string(o.pv.Status.Phase)
		if r.Class == "" {
			r.Class = o.pv.Spec.StorageClassName
		}
		if q, ok := o.pv.Spec.Capacity[corev1.ResourceStorage]; ok {
			r.CapacityBytes = q.Value()
		}
		if o.pv.Spec.CSI != nil {
			r.VolumeID = o.pv.Spec.CSI.VolumeHandle
			if id, err := pool.ParseVolumeID(r.VolumeID); err == nil {
				r.Pool = id.Pool
			}
		}
		vas, err := e.attachments(ctx)
		if err != nil {
			return nil, err
		}
		o.vas = vas[o.pv.Name]
		for _, va := range o.vas {
			a := AttachmentReport{Name: va.Name, Node: va.Spec.NodeName, Attached: va.Status.Attached}
			if va.Status.AttachError != nil {
				a.AttachError = va.Status.AttachError.Message
			}
			if va.Status.DetachError != nil {
				a.DetachError = va.Status.DetachError.Message
			}
			r.Attachments = append(r.Attachments, a)
		}
		r.Node = attachedNode(o.vas)
		snaps, err := e.snapshotsByVolume(ctx)
		if err != nil {
			return nil, err
		}
		if snaps == nil {
			r.Snapshots = nil
		} else {
			r.Snapshots = append(r.Snapshots, snaps[r.VolumeID]...)
		}
		if err := e.readRecord(ctx, r, o); err != nil {
			return nil, err
		}
	}
	if err := e.pathEvents(ctx, o); err != nil {
		return nil, err
	}
	for _, ev := range o.events {
		r.Events = append(r.Events, EventReport{Object: ev.InvolvedObject.Kind + "/" + ev.InvolvedObject.Name,
			Type: ev.Type, Reason: ev.Reason, Message: ev.Message, Count: ev.Count, LastSeen: metav1.NewTime(eventTime(&ev))})
	}
	r.Waiting = waitingFor(o, e.now())
	return r, nil
}

// readRecord asks the node plugins for the volume's record: the node it is
// attached to first, then any that has it staged.
func (e *env) readRecord(ctx context.Context, r *ClaimPath, o *pathObjects) error {
	// Only the nodes on the claim's way are asked: one exec each, not one
	// per node of the cluster.
	ask := map[string]bool{}
	for _, va := range o.vas {
		ask[va.Spec.NodeName] = true
	}
	for _, p := range o.pods {
		ask[p.Spec.NodeName] = true
	}
	c, err := e.gather(ctx, func(n *nodeView) bool { return ask[n.name] })
	if err != nil {
		return err
	}
	if n, v := c.volume(r.VolumeID); v != nil {
		r.Record, o.node = v, n
		if r.Node == "" {
			r.Node = n.name
		}
		return nil
	}
	if n := c.node(r.Node); n != nil {
		o.node = n
		if n.statusErr != nil {
			r.NodeError = n.statusErr.Error()
		}
	}
	return nil
}

// pathEvents reads the Events of the claim, PV, attachments and Pods. The
// field selector narrows the list on a real API server; the match after it
// is what decides (and what a fake client, which ignores field selectors,
// relies on).
func (e *env) pathEvents(ctx context.Context, o *pathObjects) error {
	type object struct {
		kind, ns, name string
		uid            types.UID
	}
	var objs []object
	if o.pvc != nil {
		objs = append(objs, object{"PersistentVolumeClaim", o.pvc.Namespace, o.pvc.Name, o.pvc.UID})
	}
	if o.pv != nil {
		objs = append(objs, object{"PersistentVolume", "", o.pv.Name, o.pv.UID})
	}
	for _, va := range o.vas {
		objs = append(objs, object{"VolumeAttachment", "", va.Name, va.UID})
	}
	for _, p := range o.pods {
		objs = append(objs, object{"Pod", p.Namespace, p.Name, p.UID})
	}
	for _, obj := range objs {
		sel := fields.Set{"involvedObject.kind": obj.kind, "involvedObject.name": obj.name}
		if obj.uid != "" {
			sel["involvedObject.uid"] = string(obj.uid)
		}
		list, err := e.kube.CoreV1().Events(obj.ns).List(ctx, metav1.ListOptions{FieldSelector: sel.AsSelector().String()})
		if err != nil {
			return fmt.Errorf("list the Events of %s %s: %w", obj.kind, obj.name, err)
		}
		var mine []corev1.Event
		for _, ev := range list.Items {
			ref := ev.InvolvedObject
			if ref.Kind == obj.kind && ref.Name == obj.name && (ref.UID == "" || obj.uid == "" || ref.UID == obj.uid) &&
				(obj.ns == "" || ref.Namespace == obj.ns) {
				mine = append(mine, ev)
			}
		}
		slices.SortStableFunc(mine, func(a, b corev1.Event) int { return eventTime(&a).Compare(eventTime(&b)) })
		o.events = append(o.events, mine[max(0, len(mine)-eventsPerObject):]...)
	}
	slices.SortStableFunc(o.events, func(a, b corev1.Event) int { return eventTime(&a).Compare(eventTime(&b)) })
	return nil
}

// eventTime is when an Event was last seen, whichever API wrote it.
func eventTime(ev *corev1.Event) time.Time {
	switch {
	case ev.Series != nil:
		return ev.Series.LastObservedTime.Time
	case !ev.LastTimestamp.IsZero():
		return ev.LastTimestamp.Time
	case !ev.EventTime.IsZero():
		return ev.EventTime.Time
	}
	return ev.CreationTimestamp.Time
}

func (r *DescribeReport) write(e *env) {
	w := e.out
	if r.Pod != nil {
		kv(w, "Pod", r.Pod.Namespace+"/"+r.Pod.Name)
		kv(w, "Status", podState(*r.Pod))
		if len(r.Claims) == 0 {
			fmt.Fprintf(w, "\nThe Pod uses no claim of %s.\n", e.opts.driver)
		}
	}
	for i, p := range r.Claims {
		if i > 0 || r.Pod != nil {
			fmt.Fprintln(w)
		}
		p.write(e)
	}
}

func (p *ClaimPath) write(e *env) {
	w := e.out
	if p.Claim != "" {
		kv(w, "Claim", p.Namespace+"/"+p.Claim)
		kv(w, "Status", orDash(p.Phase))
		class := orDash(p.Class)
		if p.BindingMode != "" {
			class += " (" + p.BindingMode + ")"
		}
		kv(w, "Class", class)
		kv(w, "Requested", orDash(p.Requested))
		if p.SelectedNode != "" {
			kv(w, "Selected node", p.SelectedNode)
		}
	}
	if p.PV != "" {
		kv(w, "PV", p.PV+" ("+p.PVPhase+", "+bytesIEC(p.CapacityBytes)+")")
		kv(w, "Volume ID", p.VolumeID)
		kv(w, "Pool", orDash(p.Pool))
		for _, a := range p.Attachments {
			state := pick(a.Attached, "attached to ", "not attached to ") + a.Node
			// A VolumeAttachment name alone is 68 columns: the node may go to a line of its own.
			kv(w, "Attachment", paint(wrap(a.Name+": "+state, 16, 16), pick(a.Attached, good, warn), e.color))
			if a.AttachError != "" {
				kv(w, "  Attach error", paint(wrap(a.AttachError, 16, 16), bad, e.color))
			}
			if a.DetachError != "" {
				kv(w, "  Detach error", paint(wrap(a.DetachError, 16, 16), bad, e.color))
			}
		}
		if len(p.Attachments) == 0 {
			kv(w, "Attachment", "none")
		}
		kv(w, "Node", orDash(p.Node))
		if v := p.Record; v != nil {
			kv(w, "Image", v.Image)
			kv(w, "Loop device", orDash(v.Device))
			kv(w, "Staging path", orDash(v.StagingPath))
			for i, t := range v.TargetPaths {
				kv(w, pick(i == 0, "Target paths", ""), t)
			}
			if len(v.TargetPaths) == 0 {
				kv(w, "Target paths", "none")
			}
			kv(w, "Mount options", orDash(strings.Join(v.MountOptions, ",")))
			kv(w, "Health", paint(v.Health, pick(v.Health == statusapi.HealthOK, good, bad), e.color))
			for _, c := range v.Conditions {
				kv(w, "", c.Reason+": "+c.Message)
			}
			rec := "staged " + pick(v.Staged.IsZero(), "(no record)", v.Staged.UTC().Format(time.RFC3339))
			rec += pick(v.Attached, ", attached", ", NOT attached (detached under it)")
			if v.FsType != "" {
				rec += ", " + v.FsType
			}
			if v.Block {
				rec += ", block"
			}
			if v.ReadOnly {
				rec += ", read-only"
			}
			kv(w, "Driver record", rec)
		} else if p.NodeError != "" {
			kv(w, "Driver record", paint("unknown: "+p.NodeError, bad, e.color))
		} else {
			kv(w, "Driver record", "no node has it staged")
		}
		if p.Snapshots == nil {
			kv(w, "Snapshots", "- (no snapshot CRDs)")
		} else {
			kv(w, "Snapshots", pick(len(p.Snapshots) == 0, "none", strings.Join(p.Snapshots, ", ")))
		}
	}
	for i, pod := range p.Pods {
		kv(w, pick(i == 0, "Used by", ""), pod.Namespace+"/"+pod.Name+" ("+podState(pod)+")")
	}
	if len(p.Pods) == 0 && p.Claim != "" {
		kv(w, "Used by", "no Pod")
	}
	if p.Waiting != "" {
		// One line, however long: it is what a reader (or a script)
		// looks for first.
		kv(w, "Waiting", paint(p.Waiting, warn, e.color))
	}
	if len(p.Events) == 0 {
		return
	}
	fmt.Fprintln(w, "Events:")
	for _, ev := range p.Events {
		head := fmt.Sprintf("  %-8s %-8s %s  %s", age(e.now().Sub(ev.LastSeen.Time))+" ago", ev.Type, ev.Reason, ev.Object)
		if ev.Count > 1 {
			head += fmt.Sprintf(" (x%d)", ev.Count)
		}
		fmt.Fprintln(w, paint(truncate(head, maxWidth), pick(ev.Type == corev1.EventTypeWarning, warn, plain), e.color))
		fmt.Fprintln(w, wrap("    "+ev.Message, 0, 4))
	}
}

// podState is a Pod's phase, and the reason a container waits.
func podState(p PodRef) string {
	s := p.Phase
	if p.Reason != "" {
		s += ", " + p.Reason
	}
	if p.Node != "" {
		s += ", on " + p.Node
	}
	return s
}

// kv prints one "Key:  value" line of describe, values aligned.
func kv(w io.Writer, key, value string) {
	if key != "" {
		key += ":"
	}
	fmt.Fprintf(w, "%-15s %s\n", key, value)
}

// wrap breaks s at spaces into lines of at most maxWidth columns, the
// following ones indented by indent; first is how many columns precede s
// on its first line. A word longer than a line stays whole.
func wrap(s string, first, indent int) string {
	var b strings.Builder
	line, width := "", maxWidth-first
	for _, word := range strings.Fields(s) {
		lead := ""
		if b.Len() == 0 && line == "" {
			lead = s[:len(s)-len(strings.TrimLeft(s, " "))]
		}
		switch {
		case line == "":
			line = lead + word
		case len([]rune(line))+1+len([]rune(word)) > width:
			b.WriteString(line + "\n")
			line, width = strings.Repeat(" ", indent)+word, maxWidth
		default:
			line += " " + word
		}
	}
	b.WriteString(line)
	return b.String()
}
