package multinode

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/loopvol/loopvol/internal/harness/cluster"
)

// baselineEnv runs TestNodeFailure, the baseline: it is a benchmark, too
// long for `make test` (TestNodeFailureFenced, its fencing run, is there).
const baselineEnv = "LOOPVOL_NODE_FAILURE_BASELINE"

const (
	// failureWatch is how long the test watches after the fault for the
	// Pod to move: kube-controller-manager's maxWaitForUnmountDuration,
	// after which upstream force-detaches a volume of a Pod being deleted
	// (kubernetes-csi/external-attacher#215 for why nothing earlier does).
	failureWatch = 6 * time.Minute
	// operatorDelay is when, after the fault, the operator's variant puts
	// the out-of-service taint on the failed node: someone who saw it go
	// and acted at once.
	operatorDelay = 10 * time.Second
	// returnWatch is how long the failed node's writer goes on after the
	// node is back before the volume is read again.
	returnWatch = 60 * time.Second
	// fencedMoveWithin is what the fencing run asserts (issue 26): the Pod
	// runs on the other node within it of the fault.
	fencedMoveWithin = 90 * time.Second
)

// writerScript appends a numbered line (sequence, node, the Pod's UID and
// the time in seconds) to /data/seq.log every 100 ms, fsyncs the file and
// then prints "acked <n>": what its log says was acknowledged is on the
// volume, unless something lost it. The UID tells the Pods of the
// StatefulSet apart, the node where each wrote.
const writerScript = `i=0; while :; do ` +
	`if echo "$i $NODE $UID $(busybox date +%s)" >> /data/seq.log && busybox sync /data/seq.log; then echo "acked $i"; else echo "failed $i"; fi; ` +
	`i=$((i+1)); busybox sleep 0.1; done`

// nodeFault is what happens to the failed node, and how it comes back.
type nodeFault struct {
	name        string
	fail, bring func(c *cluster.Cluster, node string) error
}

var nodeFaults = []nodeFault{
	{"Freeze", (*cluster.Cluster).FreezeNode, (*cluster.Cluster).ThawNode},
	{"CutOff",
		func(c *cluster.Cluster, n string) error { return c.SetLink(n, false) },
		func(c *cluster.Cluster, n string) error { return c.SetLink(n, true) }},
}

// TestNodeFailure: a StatefulSet's Pod writes to a volume of the shared
// pool on node B, then B fails (frozen whole, or cut off with its
// processes running); the test measures from the fault when B is NotReady,
// the old Pod deleted, its VolumeAttachment gone, a new Pod scheduled,
// attached and Running on node A, whether what the old Pod acknowledged is
// all there, and, once B is back, whether B's writes after the fault
// reached the volume the new Pod uses. Each fault runs without help
// (NoTaint) and with the operator's out-of-service taint 10 s after the
// fault (OperatorTaint).
//
// This is the baseline of issue 26: loopvol without fencing, where a move
// needs the taint and the returning node is a second writer. What it
// expects is logged, not asserted: nodeFailure's fencing parameter makes
// the same scenario the fencing run, which asserts instead that the Pod
// runs on A within 90 s of the fault without any taint, that every
// acknowledged write is there and the file system checks clean, that no
// write of B after the fence reaches the volume, and that B, back, has
// unstaged and detached its side.
func TestNodeFailure(t *testing.T) {
	if os.Getenv(baselineEnv) == "" {
		t.Skipf("the baseline without fencing watches each fault for %s (21 minutes in all): `make bench-node-failure` runs it (%s=1)", failureWatch, baselineEnv)
	}
	c, _ := up(t, false, "local")
	for _, f := range nodeFaults {
		t.Run(f.name, func(t *testing.T) {
			t.Run("NoTaint", func(t *testing.T) { nodeFailure(t, c, f, false, false) })
			t.Run("OperatorTaint", func(t *testing.T) { nodeFailure(t, c, f, true, false) })
		})
	}
}

// failureTimes are the steps after the fault, each from the fault (0: not
// seen).
type failureTimes struct {
	notReady, fenced, tainted, oldDeleting, oldGone, detached, scheduled, attached, running time.Duration
}

func (ft failureTimes) String() string {
	s := func(d time.Duration) string {
		if d == 0 {
			return "never"
		}
		return d.Round(100 * time.Millisecond).String()
	}
	return fmt.Sprintf("B NotReady %s, fenced %s, taint %s, old Pod deleting %s, gone %s, VolumeAttachment to B gone %s, new Pod on A scheduled %s, attached %s, Running %s",
		s(ft.notReady), s(ft.fenced), s(ft.tainted), s(ft.oldDeleting), s(ft.oldGone), s(ft.detached), s(ft.scheduled), s(ft.attached), s(ft.running))
}

// nodeFailure runs the scenario of TestNodeFailure for one fault; taint:
// the operator's variant. fencing false is the baseline: the outcomes that
// fencing exists to change are logged as figures; fencing true asserts
// them (see TestNodeFailure). Harness errors fail the test in both.
func nodeFailure(t *testing.T, c *cluster.Cluster, f nodeFault, taint, fencing bool) {
	ctx := context.Background()
	ns := namespace(t, c, "failure-"+strings.ToLower(f.name)+map[bool]string{false: "", true: "-taint"}[taint])
	// expect is an outcome that fencing must give and the baseline need
	// not.
	expect := func(ok bool, format string, args ...any) {
		t.Helper()
		switch {
		case ok:
		case fencing:
			t.Errorf(format, args...)
		default:
			t.Logf("baseline (no fencing): "+format, args...)
		}
	}

	// B is the node without the controller, whose attacher and
	// provisioner must go on serving A.
	ctrl, err := c.Client.CoreV1().Pods(cluster.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=controller"})
	if err != nil {
		t.Fatal(err)
	}
	if len(ctrl.Items) != 1 {
		t.Fatalf("%d controller Pods, want 1", len(ctrl.Items))
	}
	a := ctrl.Items[0].Spec.NodeName
	b := other(c, a)

	// A is cordoned while the Pod starts, so that it lands on B with no
	// affinity that would keep it there afterwards.
	kubectl(ctx, t, c, "cordon", a)
	t.Cleanup(func() { _, _ = c.Kubectl(context.Background(), "uncordon", a) })
	spec := volumePodSpec("data", writerScript)
	spec.HostNetwork = false // its processes found by B's cgroup root, not its network namespace
	spec.Containers[0].Env = append(spec.Containers[0].Env, corev1.EnvVar{Name: "UID", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.uid"}}})
	ss := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "app"},
		Spec: appsv1.StatefulSetSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "writer"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "writer"}},
				Spec:       spec,
			},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{*cluster.Claim("", "data", "loopvol", "64Mi")},
		},
	}
	if _, err := c.Client.AppsV1().StatefulSets(ns).Create(ctx, ss, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	old := running(ctx, t, c, ns, "app-0")
	if old.Spec.NodeName != b {
		t.Fatalf("app-0 runs on %s, want %s (%s cordoned)", old.Spec.NodeName, b, a)
	}
	kubectl(ctx, t, c, "uncordon", a)
	logLine(ctx, t, c, old, "acked 20")
	pv := volumeOf(ctx, t, c, ns, "data-app-0")
	// Let it write for a few seconds more, so that the fault hits a
	// writer in full flow.
	time.Sleep(3 * time.Second)

	// The fault, and B's return however the test ends, before the
	// namespace is deleted (Cleanup runs last in, first out).
	back := false
	bringBack := func() {
		if back {
			return
		}
		back = true
		if err := f.bring(c, b); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(bringBack)
	inode0 := imageInode(c, pv)
	t0 := time.Now()
	if err := f.fail(c, b); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: node %s failed at %s; app-0 (%s) wrote there, the controller runs on %s", f.name, b, t0.UTC().Format(time.RFC3339Nano), old.UID, a)

	var ft failureTimes
	var newPod *corev1.Pod
	if err := c.Wait(ctx, "the failover watch", failureWatch+time.Minute, func(ctx context.Context) (bool, error) {
		el := time.Since(t0)
		if taint && ft.tainted == 0 && el >= operatorDelay {
			kubectl(ctx, t, c, "taint", "nodes", b, corev1.TaintNodeOutOfService+"=nodeshutdown:NoExecute")
			t.Cleanup(func() {
				_, _ = c.Kubectl(context.Background(), "taint", "nodes", b, corev1.TaintNodeOutOfService+"-")
			})
			ft.tainted = time.Since(t0)
		}
		node, err := c.Client.CoreV1().Nodes().Get(ctx, b, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if ft.notReady == 0 && !nodeReady(node) {
			ft.notReady = el
		}
		if ft.tainted == 0 && slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == corev1.TaintNodeOutOfService }) {
			ft.tainted = el // the operator's, or loopvol's once it fenced B
		}
		if ft.fenced == 0 && imageInode(c, pv) != inode0 {
			ft.fenced = el
		}
		p, perr := c.Client.CoreV1().Pods(ns).Get(ctx, "app-0", metav1.GetOptions{})
		if perr != nil && !apierrors.IsNotFound(perr) {
			return false, perr
		}
		oldThere := perr == nil && p.UID == old.UID
		if ft.oldDeleting == 0 && (!oldThere || p.DeletionTimestamp != nil) {
			ft.oldDeleting = el
		}
		if ft.oldGone == 0 && !oldThere {
			ft.oldGone = el
		}
		vas, err := attachmentsOf(ctx, c, pv.Name)
		if err != nil {
			return false, err
		}
		toB := false
		for _, va := range vas {
			if va.Spec.NodeName == b {
				toB = true
			}
			if va.Spec.NodeName == a && va.Status.Attached && ft.attached == 0 {
				ft.attached = el
			}
		}
		if ft.detached == 0 && !toB {
			ft.detached = el
		}
		if perr == nil && p.UID != old.UID && p.Spec.NodeName == a {
			if ft.scheduled == 0 {
				ft.scheduled = el
			}
			if p.Status.Phase == corev1.PodRunning {
				ft.running, newPod = el, p
				return true, nil
			}
		}
		return el >= failureWatch, nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s, taint %t: after the fault: %s", f.name, taint, ft)
	expect(ft.running != 0, "app-0 never ran on %s within %s of the fault", a, failureWatch)
	expect(ft.running != 0 && ft.running <= fencedMoveWithin, "app-0 not Running on %s within %s of the fault (%s)", a, fencedMoveWithin, ft)

	// What the old Pod acknowledged before the fault, by its log's
	// timestamps (the log lags the fsync, so this is the part known to
	// be acknowledged in time).
	acked, err := ackedBefore(c, old, t0)
	if err != nil {
		t.Fatal(err)
	}
	var first []seqLine
	if newPod != nil {
		if first, err = readSeq(ctx, c, newPod); err != nil {
			// A volume that the new Pod cannot read is an outcome.
			expect(false, "the new Pod cannot read the volume: %v", err)
		} else {
			missing := missingAcked(first, old.UID, acked)
			t.Logf("%s, taint %t: the new Pod reads %d lines; the old Pod acknowledged %d before the fault, %d of them missing", f.name, taint, len(first), len(acked), len(missing))
			expect(len(missing) == 0, "acknowledged writes of the old Pod missing: %v", head(missing))
		}
	}

	// B comes back; its writer resumes (frozen) or never stopped (cut
	// off), while the new Pod writes on A. The old Pod's log is kept as
	// it grows: B's kubelet removes it with the container.
	keep := keepLog(c, old)
	t.Cleanup(func() { _, _ = keep() })
	bringBack()
	tBack := time.Now()
	if err := c.Wait(ctx, "node "+b+" Ready again", 3*time.Minute, func(ctx context.Context) (bool, error) {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, b, metav1.GetOptions{})
		return err == nil && nodeReady(node), err
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s, taint %t: node %s Ready again %s after it came back", f.name, taint, b, since(tBack))
	if fencing && !taint {
		// loopvol takes its taint off once B is Ready and its plugin has
		// let go of the fenced volume (kubelet unmounts the deleted Pod's).
		if err := c.Wait(ctx, "loopvol's out-of-service taint off "+b+" once it is clean", 3*time.Minute, func(ctx context.Context) (bool, error) {
			node, err := c.Client.CoreV1().Nodes().Get(ctx, b, metav1.GetOptions{})
			return err == nil && !slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == corev1.TaintNodeOutOfService }), err
		}); err != nil {
			t.Error(err)
		}
		t.Logf("%s, taint %t: loopvol's out-of-service taint off %s %s after it came back", f.name, taint, b, since(tBack))
	}
	time.Sleep(returnWatch - time.Since(tBack))

	// What B did after the fault, by its own account: the old Pod's log
	// (gone once kubelet removed the container).
	oldAcked, logErr := keep()
	ackedAfter := 0
	for _, at := range oldAcked {
		// A frozen shim stamps what it had not yet read when thawed: a
		// line or two of this may be from before the fault.
		if at.After(t0) {
			ackedAfter++
		}
	}
	oldLog := "read"
	if logErr != nil {
		oldLog = "not readable: " + logErr.Error()
	}
	if newPod != nil {
		// The new Pod's view after B's return: B's lines stamped a
		// whole second after the fault reached the volume A writes.
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "app-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.UID != newPod.UID {
			expect(false, "the new Pod %s on %s was replaced by %s on %s after %s came back", newPod.UID, a, p.UID, p.Spec.NodeName, b)
		}
		// Its acknowledgements up to the read, not those logged while
		// cat ran.
		tRead := time.Now()
		later, err := readSeq(ctx, c, newPod)
		if err != nil {
			expect(false, "the new Pod cannot read the volume after %s came back: %v", b, err)
		}
		// After the fault, and with fencing after the fence: what B
		// wrote between the fault and the fence (a cut-off node writes on
		// until its self-fence) was acknowledged and belongs to the
		// volume; only what came after must not be there. Stamps are
		// whole seconds: a line of the fence's own second is not counted.
		cut := t0
		if ft.fenced != 0 {
			cut = t0.Add(ft.fenced)
		}
		fromB := 0
		for _, l := range later {
			if l.uid == string(old.UID) && l.stamp > cut.Unix() {
				fromB++
			}
		}
		newAcked, _ := ackedBefore(c, newPod, tRead)
		lostA := missingAcked(later, newPod.UID, newAcked)
		t.Logf("%s, taint %t: %s after %s came back: the new Pod reads %d lines (%d at its start); %d lines of the old Pod written after the fault; the old Pod acknowledged %d writes after the fault by its log (%s); %d of the new Pod's %d acknowledged writes missing",
			f.name, taint, returnWatch, b, len(later), len(first), fromB, ackedAfter, oldLog, len(lostA), len(newAcked))
		expect(fromB == 0, "%d writes of %s after the fault (after the fence, with fencing) reached the volume the new Pod uses", fromB, b)
		expect(len(lostA) == 0, "%d acknowledged writes of the new Pod lost (two writers on one file system): %v", len(lostA), head(lostA))
	} else {
		t.Logf("%s, taint %t: %s after %s came back: the old Pod acknowledged %d writes after the fault by its log (%s)", f.name, taint, returnWatch, b, ackedAfter, oldLog)
	}

	// The Pods go, and with them both nodes' mounts and loop devices;
	// then the image is checked while nothing has it staged.
	if _, err := c.Client.AppsV1().StatefulSets(ns).Patch(ctx, "app", types.MergePatchType, []byte(`{"spec":{"replicas":0}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	tClean := time.Now()
	if err := c.Wait(ctx, "app-0 gone and its volume detached from both nodes", 4*time.Minute, func(ctx context.Context) (bool, error) {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(pods.Items) > 0 {
			return false, err
		}
		vas, err := attachmentsOf(ctx, c, pv.Name)
		return len(vas) == 0, err
	}); err != nil {
		// Left attached is B's side not cleaned up: the fencing run's
		// failure, the baseline's figure; the namespace's deletion
		// then waits on it again.
		expect(false, "cleaning up: %v", err)
	} else {
		t.Logf("%s, taint %t: the Pods gone and the volume detached %s after scale-down", f.name, taint, since(tClean))
	}
	out, clean, err := fsckImage(c, pv)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s, taint %t: fsck of the image: clean %t\n%s", f.name, taint, clean, out)
	expect(clean, "the volume's file system does not check clean")
}

func since(t time.Time) time.Duration { return time.Since(t).Round(100 * time.Millisecond) }

func nodeReady(n *corev1.Node) bool {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// attachmentsOf lists every VolumeAttachment of pv (one per node while a
// detach and an attach overlap).
func attachmentsOf(ctx context.Context, c *cluster.Cluster, pv string) ([]storagev1.VolumeAttachment, error) {
	vas, err := c.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []storagev1.VolumeAttachment
	for _, va := range vas.Items {
		if va.Spec.Source.PersistentVolumeName != nil && *va.Spec.Source.PersistentVolumeName == pv {
			out = append(out, va)
		}
	}
	return out, nil
}

// ackedBefore reads pod's container log (CRI format: time, stream, tag,
// line) from its node's log directory and returns the "acked <n>" lines
// logged before t, with their times.
func ackedBefore(c *cluster.Cluster, pod *corev1.Pod, t time.Time) (map[int]time.Time, error) {
	log, err := c.ContainerLog(pod, "main")
	if err != nil {
		return nil, fmt.Errorf("the log of %s: %w", pod.UID, err)
	}
	acked := map[int]time.Time{}
	for _, l := range strings.Split(log, "\n") {
		f := strings.Fields(l)
		if len(f) != 5 || f[3] != "acked" {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, f[0])
		n, nerr := strconv.Atoi(f[4])
		if err != nil || nerr != nil || !at.Before(t) {
			continue
		}
		acked[n] = at
	}
	return acked, nil
}

// keepLog reads pod's container log every 200 ms until the returned
// function is called (again at the test's end: the reader stops whatever
// happened), which returns the acked lines of the last read, or the first
// error when none succeeded.
func keepLog(c *cluster.Cluster, pod *corev1.Pod) func() (map[int]time.Time, error) {
	stop, done := make(chan struct{}), make(chan struct{})
	var last map[int]time.Time
	var firstErr error
	go func() {
		defer close(done)
		for {
			acked, err := ackedBefore(c, pod, time.Now().Add(time.Hour))
			switch {
			case err == nil:
				last = acked
			case firstErr == nil:
				firstErr = err
			}
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	var once sync.Once
	return func() (map[int]time.Time, error) {
		once.Do(func() { close(stop) })
		<-done
		if last != nil {
			return last, nil
		}
		return nil, firstErr
	}
}

// seqLine is a line of writerScript's file.
type seqLine struct {
	seq   int
	node  string
	uid   string
	stamp int64
}

// readSeq reads /data/seq.log through pod, as its application would; a
// line that does not parse (a torn or overwritten one) is left out.
func readSeq(ctx context.Context, c *cluster.Cluster, pod *corev1.Pod) ([]seqLine, error) {
	out, err := c.Kubectl(ctx, "exec", "-n", pod.Namespace, pod.Name, "--", "/bin/busybox", "cat", "/data/seq.log")
	if err != nil {
		return nil, err
	}
	var lines []seqLine
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) != 4 {
			continue
		}
		n, err := strconv.Atoi(f[0])
		stamp, serr := strconv.ParseInt(f[3], 10, 64)
		if err != nil || serr != nil {
			continue
		}
		lines = append(lines, seqLine{seq: n, node: f[1], uid: f[2], stamp: stamp})
	}
	return lines, nil
}

// missingAcked are the sequence numbers of acked, the writes of the Pod
// uid, that lines lacks, in order.
func missingAcked(lines []seqLine, uid types.UID, acked map[int]time.Time) []int {
	have := map[int]bool{}
	for _, l := range lines {
		if l.uid == string(uid) {
			have[l.seq] = true
		}
	}
	var missing []int
	for n := range acked {
		if !have[n] {
			missing = append(missing, n)
		}
	}
	slices.Sort(missing)
	return missing
}

// head is the first few of s, for a log line.
func head(s []int) []int { return s[:min(len(s), 10)] }

// imagePath is the path of pv's image under the pool ("" if there is
// none), wherever a move put it.
func imagePath(c *cluster.Cluster, pv *corev1.PersistentVolume) string {
	_, hash, ok := strings.Cut(pv.Spec.CSI.VolumeHandle, ".")
	if !ok {
		return ""
	}
	var image string
	_ = filepath.WalkDir(c.PoolDir(), func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && d.Name() == hash+".img" {
			image = p
		}
		return nil
	})
	return image
}

// imageInode is the inode of pv's image (0 if none): a fence replaces it.
func imageInode(c *cluster.Cluster, pv *corev1.PersistentVolume) uint64 {
	var st syscall.Stat_t
	if p := imagePath(c, pv); p == "" || syscall.Stat(p, &st) != nil {
		return 0
	}
	return st.Ino
}

// fsckImage checks the file system of pv's image in the pool, read-only
// (fsck -n: nothing is repaired, so a second run sees the same), and
// returns fsck's output and whether it found it clean.
func fsckImage(c *cluster.Cluster, pv *corev1.PersistentVolume) (string, bool, error) {
	image := imagePath(c, pv)
	if image == "" {
		return "", false, fmt.Errorf("no image of %s under %s", pv.Spec.CSI.VolumeHandle, c.PoolDir())
	}
	fsType := pv.Spec.CSI.FSType
	if fsType == "" {
		fsType = "ext4"
	}
	out, err := exec.Command("fsck."+fsType, "-f", "-n", image).CombinedOutput()
	if exit, isExit := err.(*exec.ExitError); isExit {
		// e2fsck: 0 clean, 4 errors left uncorrected; anything else
		// (8 and up) is fsck's own failure.
		if exit.ExitCode() < 8 {
			return string(out), false, nil
		}
	}
	if err != nil {
		return string(out), false, fmt.Errorf("fsck.%s %s: %w: %s", fsType, image, err, out)
	}
	return string(out), true, nil
}
