package bench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/loopvol/loopvol/test/internal/attacherproc"
	"github.com/loopvol/loopvol/test/internal/extattacher"
)

const (
	benchDriver = "loopvol.csi.io"
	// benchLabel marks every object of one configuration with its run ID,
	// so the watch sees only that run and cleanup finds everything.
	benchLabel = "bench.loopvol.csi.io/run"
	// upstreamVersion is the external-attacher the goals of issue 3 name.
	upstreamVersion = "v4.13.0"
	// parallelism of the benchmark's own creates and deletes.
	clientWorkers = 32
)

// tunedFlags are the equal flags both attachers get in the tuned runs.
var tunedFlags = []string{"--kube-api-qps=1000", "--kube-api-burst=2000", "--worker-threads=100"}

// attacherKnobs are the environment settings of BenchmarkAttacher.
type attacherKnobs struct {
	vas, nodes, upstreamDefaultVAs int
	upstream                       bool
	upstreamBinary                 string
	loopvolArgs                    []string
	latencies                      []time.Duration
	listVolumes                    bool
	backlog                        bool
	ceilingFor                     time.Duration
	ceilingWorkers                 int
	timeout                        time.Duration
}

func loadAttacherKnobs(tb testing.TB) attacherKnobs {
	tb.Helper()
	k := attacherKnobs{
		vas: 2000, nodes: 100, upstreamDefaultVAs: 200, upstream: true,
		latencies:   []time.Duration{0, 100 * time.Millisecond},
		listVolumes: true, backlog: true, ceilingFor: 10 * time.Second, ceilingWorkers: 64, timeout: 5 * time.Minute,
	}
	intKnob := func(name string, into *int) {
		if v := os.Getenv(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				tb.Fatalf("%s=%q: want a positive integer", name, v)
			}
			*into = n
		}
	}
	boolKnob := func(name string, into *bool) {
		if v := os.Getenv(name); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				tb.Fatalf("%s=%q: want 0 or 1", name, v)
			}
			*into = b
		}
	}
	durKnob := func(name string, into *time.Duration) {
		if v := os.Getenv(name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				tb.Fatalf("%s=%q: want a positive duration such as 10s", name, v)
			}
			*into = d
		}
	}
	intKnob("LOOPVOL_BENCH_VAS", &k.vas)
	intKnob("LOOPVOL_BENCH_NODES", &k.nodes)
	intKnob("LOOPVOL_BENCH_UPSTREAM_DEFAULT_VAS", &k.upstreamDefaultVAs)
	intKnob("LOOPVOL_BENCH_CEILING_WORKERS", &k.ceilingWorkers)
	boolKnob("LOOPVOL_BENCH_UPSTREAM", &k.upstream)
	boolKnob("LOOPVOL_BENCH_LIST_VOLUMES", &k.listVolumes)
	boolKnob("LOOPVOL_BENCH_BACKLOG", &k.backlog)
	durKnob("LOOPVOL_BENCH_CEILING", &k.ceilingFor)
	durKnob("LOOPVOL_BENCH_TIMEOUT", &k.timeout)
	k.upstreamBinary = os.Getenv("LOOPVOL_BENCH_EXTERNAL_ATTACHER")
	k.loopvolArgs = strings.Fields(os.Getenv("LOOPVOL_BENCH_LOOPVOL_ARGS"))
	if v := os.Getenv("LOOPVOL_BENCH_LATENCIES"); v != "" {
		k.latencies = nil
		for _, f := range strings.Split(v, ",") {
			f = strings.TrimSpace(f)
			if f == "0" {
				f = "0s"
			}
			d, err := time.ParseDuration(f)
			if err != nil || d < 0 {
				tb.Fatalf("LOOPVOL_BENCH_LATENCIES=%q: want durations such as 0,100ms", v)
			}
			k.latencies = append(k.latencies, d)
		}
	}
	return k
}

// attacherRun is one configuration: which attacher, which flags, which
// publish latency, how many VolumeAttachments.
type attacherRun struct {
	attacher       string // "loopvol" or "external-attacher"
	binary         string
	flags          string // "defaults" or "tuned"
	args           []string
	publishLatency time.Duration
	vas            int
	// backlog: the VAs are all created before the attacher starts, so the
	// API server serves only the attacher while it works.
	backlog bool
}

func (r attacherRun) name() string {
	return fmt.Sprintf("%s/%s/publish=%s", r.attacher, r.scenario(), r.publishLatency)
}

// scenario is the flags, and "-backlog" for a backlog run.
func (r attacherRun) scenario() string {
	if r.backlog {
		return r.flags + "-backlog"
	}
	return r.flags
}

// attacherResult is what one configuration measured.
type attacherResult struct {
	attacherRun
	done      bool   // every VA attached and every VA gone
	problem   string // why not, when not done
	attachAll time.Duration
	detachAll time.Duration
	attachLat stats         // VA creation → watch sees attached=true
	claimLat  stats         // VA creation → watch sees the finalizer (queue wait + PV patch + VA patch)
	workLat   stats         // finalizer seen → attached seen (ControllerPublish + status patch)
	createAll time.Duration // the benchmark's creates: first sent → last done
	// attachWrites counts every write request the API server served from
	// the first create until all were attached (creates included).
	attachWrites float64
	// cpuBusy is the share of the machine's CPU time that was busy (all
	// processes) until all were attached.
	cpuBusy float64
	// foreign lists other control planes seen running on the machine during
	// the run: their load makes the figures worse and noisier.
	foreign    string
	publishes  int // ControllerPublishVolume calls on the run's volumes
	notOnce    int // VAs whose volume was published other than once
	unpublish  int // ControllerUnpublishVolume calls
	attachErrs int // VAs that showed an attachError at some point
	writes     apiWrites
	ownWrites  float64 // the benchmark's creates and deletes in the window
	mem        memory  // of the attacher, at the end of the window
	// CPU time used in the window by the attacher process and by the API
	// server (the machine's two cores also run etcd and the benchmark).
	attacherCPU  time.Duration
	apiserverCPU float64
}

func (r attacherResult) attachesPerSec() float64 {
	if !r.done || r.attachAll <= 0 {
		return 0
	}
	return float64(r.vas) / r.attachAll.Seconds()
}

// attacherResources are the resources whose writes count as the
// attacher's: it patches VolumeAttachments (metadata and status) and
// PersistentVolumes and records Events; the benchmark's own VolumeAttachment
// creates and deletes are subtracted. Leases and the like are the API
// server's own bookkeeping (no leader election runs).
var attacherResources = []string{"volumeattachments", "persistentvolumes", "events"}

func (r attacherResult) writesPerVA() float64 {
	return (r.writes.total(attacherResources...) - r.ownWrites) / float64(r.vas)
}

// BenchmarkAttacher measures VolumeAttachment throughput (issue 3): loopvol's
// attacher and external-attacher v4.13.0 side by side, at their default
// flags and with equal tuned flags, against the real control plane and a
// stub CSI controller served by this process (ControllerPublish latency 0
// and 100 ms), and the API server's ceiling (status patches/s from an
// unthrottled client) before and after. It prints a markdown report; the
// figures and their reading are in docs/benchmarks.md.
//
// Knobs (environment):
//
//	LOOPVOL_BENCH_VAS=2000                  VolumeAttachments per run
//	LOOPVOL_BENCH_NODES=100                 nodes (CSINodes) they spread over
//	LOOPVOL_BENCH_UPSTREAM_DEFAULT_VAS=200  VAs for external-attacher at its defaults (1.7/s)
//	LOOPVOL_BENCH_UPSTREAM=0                skip external-attacher
//	LOOPVOL_BENCH_EXTERNAL_ATTACHER=<path>  use this csi-attacher binary instead of building it
//	LOOPVOL_BENCH_LATENCIES=0,100ms         ControllerPublish/Unpublish latencies of the stub
//	LOOPVOL_BENCH_LIST_VOLUMES=0            stub without LIST_VOLUMES(_PUBLISHED_NODES)
//	LOOPVOL_BENCH_BACKLOG=0                 skip the tuned runs with all VAs created before the attacher starts
//	LOOPVOL_BENCH_CEILING=10s               length of each ceiling measurement
//	LOOPVOL_BENCH_CEILING_WORKERS=64        goroutines of the ceiling measurement
//	LOOPVOL_BENCH_TIMEOUT=5m                limit of each attach or detach phase
//	LOOPVOL_BENCH_LOOPVOL_ARGS="..."        extra flags for loopvol's attacher (e.g. --http-endpoint=127.0.0.1:9911 --enable-pprof)
//
// Each run starts from an empty cluster (its CSINodes, PVs and VAs carry
// a run label and are removed, finalizers first, before the next run) with
// a fresh stub driver and attacher process, and a warm-up attach/detach
// that proves the attacher's caches are synced.
func BenchmarkAttacher(b *testing.B) {
	k := loadAttacherKnobs(b)
	env := cluster.Env(b)
	kubeconfig := env.Kubeconfig(b)

	fast := rest.CopyConfig(env.Config)
	fast.QPS = -1 // no client-side rate limit
	fast.ContentType = runtime.ContentTypeProtobuf
	fast.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	client, err := kubernetes.NewForConfig(fast)
	if err != nil {
		b.Fatal(err)
	}
	ctx := b.Context()

	version := "unknown"
	if v, err := env.Client.Discovery().ServerVersion(); err == nil {
		version = v.GitVersion
	}
	ours := attacherproc.Binary(b)
	upstream := ""
	if k.upstream {
		upstream = k.upstreamBinary
		if upstream == "" {
			bctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
			upstream, err = extattacher.Build(bctx, upstreamVersion, os.Stdout)
			cancel()
			if err != nil {
				fmt.Printf("external-attacher %s could not be built, so loopvol's attacher runs alone: %v\n", upstreamVersion, err)
				upstream = ""
			}
		}
	}

	var ceilings []float64
	measureCeiling := func(when string) {
		b.Run("apiserver-ceiling/"+when, func(b *testing.B) {
			c := statusPatchCeiling(b, client, k.ceilingWorkers, k.ceilingFor)
			if n := otherProcesses("kube-apiserver"); n > 0 {
				fmt.Printf("WARNING: %d other kube-apiserver process(es) ran on this machine while the ceiling was measured\n", n)
			}
			ceilings = append(ceilings, c)
			b.ReportMetric(c, "patches/s")
		})
	}
	measureCeiling("start")

	var runs []attacherRun
	for _, lat := range k.latencies {
		if upstream != "" {
			runs = append(runs, attacherRun{attacher: "external-attacher", binary: upstream, flags: "defaults", publishLatency: lat, vas: k.upstreamDefaultVAs})
		}
		runs = append(runs, attacherRun{attacher: "loopvol", binary: ours, flags: "defaults", publishLatency: lat, vas: k.vas})
		if upstream != "" {
			runs = append(runs, attacherRun{attacher: "external-attacher", binary: upstream, flags: "tuned", args: tunedFlags, publishLatency: lat, vas: k.vas})
		}
		runs = append(runs, attacherRun{attacher: "loopvol", binary: ours, flags: "tuned", args: tunedFlags, publishLatency: lat, vas: k.vas})
		if k.backlog {
			if upstream != "" {
				runs = append(runs, attacherRun{attacher: "external-attacher", binary: upstream, flags: "tuned", args: tunedFlags, publishLatency: lat, vas: k.vas, backlog: true})
			}
			runs = append(runs, attacherRun{attacher: "loopvol", binary: ours, flags: "tuned", args: tunedFlags, publishLatency: lat, vas: k.vas, backlog: true})
		}
	}
	var results []attacherResult
	for _, run := range runs {
		b.Run(run.name(), func(b *testing.B) {
			res := runAttacher(b, client, env.Client, kubeconfig, k, run)
			results = append(results, res)
			if res.done {
				b.ReportMetric(res.attachesPerSec(), "attaches/s")
				b.ReportMetric(float64(res.attachLat.median.Milliseconds()), "median-ms")
				b.ReportMetric(float64(res.attachLat.p99.Milliseconds()), "p99-ms")
				b.ReportMetric(float64(res.publishes)/float64(res.vas), "publishes/VA")
				b.ReportMetric(res.writesPerVA(), "writes/VA")
				b.ReportMetric(float64(res.mem.peakRSS)/1e6, "peak-RSS-MB")
			}
		})
	}
	measureCeiling("end")

	printAttacherReport(k, version, upstream != "", ceilings, results)
}

// statusPatchCeiling creates 500 VolumeAttachments of a driver nobody
// serves and patches their status subresource (attached flipping between
// true and false, so each patch is a real write) from workers goroutines
// with an unthrottled client for d after a 2 s warm-up. It returns the
// completed patches per second: what the API server and etcd sustain for
// the one write every attach must make.
func statusPatchCeiling(b *testing.B, client kubernetes.Interface, workers int, d time.Duration) float64 {
	ctx := b.Context()
	id := "ceiling-" + shortID()
	const n = 500
	names := make([]string, n)
	err := parallel(ctx, n, clientWorkers, func(ctx context.Context, i int) error {
		va, err := client.StorageV1().VolumeAttachments().Create(ctx, &storagev1.VolumeAttachment{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%03d", id, i), Labels: map[string]string{benchLabel: id}},
			Spec: storagev1.VolumeAttachmentSpec{
				Attacher: "ceiling.bench.invalid",
				NodeName: "ceiling-node",
				Source:   storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To(fmt.Sprintf("%s-pv-%03d", id, i))},
			},
		}, metav1.CreateOptions{})
		if err == nil {
			names[i] = va.Name
		}
		return err
	})
	b.Cleanup(func() { deleteRunObjects(b, client, id) })
	if err != nil {
		b.Fatalf("create VolumeAttachments for the ceiling: %v", err)
	}
	// Workers stop after their request in flight rather than by a cancelled
	// context, which client-go would report once per request.
	var counting, stop atomic.Bool
	var count, failed atomic.Int64
	var wg sync.WaitGroup
	for w := range min(workers, n) {
		wg.Go(func() {
			// Worker w owns names w, w+workers, …: nobody else patches them,
			// so flipping the value it last wrote always changes the object.
			var mine []string
			for i := w; i < n; i += workers {
				mine = append(mine, names[i])
			}
			attached := make([]bool, len(mine))
			for i := 0; !stop.Load() && ctx.Err() == nil; i++ {
				j := i % len(mine)
				attached[j] = !attached[j]
				patch := fmt.Sprintf(`{"status":{"attached":%t}}`, attached[j])
				_, err := client.StorageV1().VolumeAttachments().Patch(ctx, mine[j], types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status")
				switch {
				case err != nil:
					failed.Add(1)
				case err == nil && counting.Load():
					count.Add(1)
				}
			}
		})
	}
	time.Sleep(2 * time.Second)
	count.Store(0)
	counting.Store(true)
	start := time.Now()
	time.Sleep(d)
	got := count.Load()
	elapsed := time.Since(start)
	stop.Store(true)
	wg.Wait()
	if f := failed.Load(); f > 0 {
		fmt.Printf("apiserver ceiling: %d patches failed\n", f)
	}
	return float64(got) / elapsed.Seconds()
}

// runAttacher runs one configuration from a clean cluster and leaves it
// clean: CSINodes and PVs, a stub driver, the attacher, a warm-up
// attach/detach, then the measured window (N VolumeAttachments created at
// once → all attached → all deleted → all gone), then everything removed.
func runAttacher(b *testing.B, client, admin kubernetes.Interface, kubeconfig string, k attacherKnobs, run attacherRun) attacherResult {
	ctx := b.Context()
	res := attacherResult{attacherRun: run}
	id := shortID()
	checkForeign := func() {
		if n := otherProcesses("kube-apiserver"); n > 0 && res.foreign == "" {
			res.foreign = fmt.Sprintf("%d other kube-apiserver process(es) ran on this machine during the run", n)
		}
	}
	checkForeign()
	defer checkForeign()
	b.Cleanup(func() { deleteRunObjects(b, client, id) })
	labels := map[string]string{benchLabel: id}

	nodes := make([]string, k.nodes)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("bench-%s-node-%03d", id, i)
	}
	if err := parallel(ctx, len(nodes), clientWorkers, func(ctx context.Context, i int) error {
		_, err := client.StorageV1().CSINodes().Create(ctx, &storagev1.CSINode{
			ObjectMeta: metav1.ObjectMeta{Name: nodes[i], Labels: labels},
			Spec:       storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: benchDriver, NodeID: nodes[i]}}},
		}, metav1.CreateOptions{})
		return err
	}); err != nil {
		b.Fatalf("create CSINodes: %v", err)
	}
	// Volume i is attached to node i mod nodes; the last one is the warm-up's.
	handles := make([]string, run.vas+1)
	vas := make([]*storagev1.VolumeAttachment, run.vas+1)
	for i := range handles {
		handles[i] = fmt.Sprintf("vol-%s-%05d", id, i)
		node := nodes[i%len(nodes)]
		vas[i] = &storagev1.VolumeAttachment{
			ObjectMeta: metav1.ObjectMeta{Name: vaName(handles[i], node), Labels: labels},
			Spec: storagev1.VolumeAttachmentSpec{
				Attacher: benchDriver,
				NodeName: node,
				Source:   storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To(fmt.Sprintf("bench-%s-%05d", id, i))},
			},
		}
	}
	if err := parallel(ctx, len(handles), clientWorkers, func(ctx context.Context, i int) error {
		_, err := client.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: *vas[i].Spec.Source.PersistentVolumeName, Labels: labels},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
				VolumeMode:                    ptr.To(corev1.PersistentVolumeFilesystem),
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
					Driver: benchDriver, VolumeHandle: handles[i], FSType: "ext4",
				}},
			},
		}, metav1.CreateOptions{})
		return err
	}); err != nil {
		b.Fatalf("create PersistentVolumes: %v", err)
	}
	warmup, measured := vas[run.vas], vas[:run.vas]

	w := watchVAs(b, client, id)
	stub := startStubCSI(b, benchDriver, run.publishLatency, k.listVolumes)
	args := append([]string{"--csi-address=" + stub.Socket, "--kubeconfig=" + kubeconfig, "--timeout=30s", "--leader-election=false"}, run.args...)
	if run.attacher == "loopvol" {
		args = append(args, k.loopvolArgs...)
	}
	names := make([]string, len(measured))
	for i, va := range measured {
		names[i] = va.Name
	}
	var own atomic.Int64 // the benchmark's own write requests in the window
	created := make([]time.Time, len(measured))
	createMeasured := func() {
		if err := parallel(ctx, len(measured), clientWorkers, func(ctx context.Context, i int) error {
			own.Add(1)
			_, err := client.StorageV1().VolumeAttachments().Create(ctx, measured[i], metav1.CreateOptions{})
			created[i] = time.Now()
			return err
		}); err != nil {
			b.Fatalf("create VolumeAttachments: %v", err)
		}
	}
	scrape := func() apiServerSnapshot {
		snap, err := scrapeAPIServer(ctx, admin)
		if err != nil {
			b.Fatal(err)
		}
		return snap
	}

	var (
		proc              *sidecar
		before, atStart   apiServerSnapshot // window start; attacher's work start
		cpuBefore         time.Duration
		busyBefore        cpuSample
		start             time.Time
		dir               = b.TempDir()
		logName           = strings.ReplaceAll(run.attacher, "/", "-")
		startAttacherProc = func() { proc = startSidecar(b, dir, logName, run.binary, args...) }
	)
	if run.backlog {
		// The VolumeAttachments exist before the attacher starts, as after
		// a restart or a leader change with work piled up: it finds them all
		// in its first list, and nothing else writes while it works.
		before = scrape()
		start = time.Now()
		createMeasured()
		atStart = scrape()
		busyBefore = readCPUSample()
		startAttacherProc()
	} else {
		startAttacherProc()
		waitWarm(b, client, w, stub, proc, warmup)
		var err error
		if cpuBefore, err = proc.cpuTime(); err != nil {
			b.Fatal(err)
		}
		before = scrape()
		atStart = before
		busyBefore = readCPUSample()
		start = time.Now()
		createMeasured()
	}
	defer proc.Stop()
	if !w.waitAttached(names, k.timeout) {
		res.problem = fmt.Sprintf("%d of %d attached after %s", w.countAttached(names), len(names), k.timeout)
	}
	res.cpuBusy = readCPUSample().busySince(busyBefore)
	mid := scrape()
	res.attachWrites = mid.writes.since(atStart.writes).total()
	claimedAt, attachedAt := w.times(names)
	res.attachErrs = w.countErrors(names)
	res.createAll = slices.MaxFunc(created, time.Time.Compare).Sub(start)
	// from is when each VA's wait began: its creation, or with a backlog
	// the moment the attacher took up its first VA (its start-up, the same
	// for any backlog, is left out).
	from := created
	if seen := slices.DeleteFunc(slices.Clone(claimedAt), time.Time.IsZero); run.backlog && len(seen) > 0 {
		first := slices.MinFunc(seen, time.Time.Compare)
		from = make([]time.Time, len(created))
		for i := range from {
			from[i] = first
		}
		start = first
	}
	var lat, wait, work []time.Duration
	var last time.Time
	for i, t := range attachedAt {
		if t.IsZero() {
			continue
		}
		lat = append(lat, t.Sub(from[i]))
		if c := claimedAt[i]; !c.IsZero() {
			wait, work = append(wait, c.Sub(from[i])), append(work, t.Sub(c))
		}
		if t.After(last) {
			last = t
		}
	}
	res.attachAll = last.Sub(start)
	if len(lat) > 0 {
		res.attachLat = summarize(lat)
	}
	if len(wait) > 0 {
		res.claimLat, res.workLat = summarize(wait), summarize(work)
	}

	delStart := time.Now()
	if err := parallel(ctx, len(measured), clientWorkers, func(ctx context.Context, i int) error {
		own.Add(1)
		err := client.StorageV1().VolumeAttachments().Delete(ctx, names[i], metav1.DeleteOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}); err != nil {
		b.Fatalf("delete VolumeAttachments: %v", err)
	}
	if !w.waitGone(names, k.timeout) && res.problem == "" {
		res.problem = fmt.Sprintf("%d of %d detached after %s", w.countGone(names), len(names), k.timeout)
	}
	res.detachAll = w.lastGone(names).Sub(delStart)
	// Writes that follow the last finalizer removal (external-attacher
	// patches the status after it, and gets a 404) land within moments.
	time.Sleep(2 * time.Second)
	after, err := scrapeAPIServer(ctx, admin)
	if err != nil {
		b.Fatal(err)
	}
	cpuAfter, err := proc.cpuTime()
	if err != nil {
		b.Fatal(err)
	}
	res.writes = after.writes.since(before.writes)
	res.apiserverCPU = after.cpu - before.cpu
	res.attacherCPU = cpuAfter - cpuBefore
	res.ownWrites = float64(own.Load())
	if res.mem, err = proc.memory(); err != nil {
		res.problem = strings.TrimPrefix(res.problem+"; ", "; ") + "peak RSS: " + err.Error()
	}
	pubs, unpubs := stub.calls(handles[:run.vas])
	for i := range pubs {
		res.publishes += pubs[i]
		res.unpublish += unpubs[i]
		if pubs[i] != 1 {
			res.notOnce++
		}
	}
	res.done = res.problem == ""
	if !res.done {
		b.Errorf("%s: %s\n%s", run.name(), res.problem, proc.Tail(4096))
	}
	if err := proc.Stop(); err != nil {
		fmt.Printf("%s: %s exited with %v after SIGTERM\n", run.name(), run.attacher, err)
	}
	stub.Stop()
	w.stop()
	deleteRunObjects(b, client, id)
	return res
}

// waitWarm waits until the attacher has asked the stub for its
// capabilities, then runs one attach and detach of warmup: that proves the
// attacher's caches are synced and its workers running. The pause after it
// refills the attacher's token bucket, so every run starts from a full
// burst.
func waitWarm(b *testing.B, client kubernetes.Interface, w *vaWatch, stub *stubCSI, proc *sidecar, warmup *storagev1.VolumeAttachment) {
	select {
	case <-stub.Probed():
	case <-proc.Done():
		b.Fatalf("%s exited before it asked the driver for its capabilities: %v\n%s", proc.Name, proc.Err(), proc.Tail(4096))
	case <-time.After(time.Minute):
		b.Fatalf("%s did not ask the driver for its capabilities within a minute:\n%s", proc.Name, proc.Tail(4096))
	}
	ctx := b.Context()
	if _, err := client.StorageV1().VolumeAttachments().Create(ctx, warmup, metav1.CreateOptions{}); err != nil {
		b.Fatalf("create the warm-up VolumeAttachment: %v", err)
	}
	if !w.waitAttached([]string{warmup.Name}, time.Minute) {
		b.Fatalf("the warm-up VolumeAttachment was not attached within a minute:\n%s", proc.Tail(4096))
	}
	if err := client.StorageV1().VolumeAttachments().Delete(ctx, warmup.Name, metav1.DeleteOptions{}); err != nil {
		b.Fatalf("delete the warm-up VolumeAttachment: %v", err)
	}
	if !w.waitGone([]string{warmup.Name}, time.Minute) {
		b.Fatalf("the warm-up VolumeAttachment was not detached within a minute:\n%s", proc.Tail(4096))
	}
	time.Sleep(3 * time.Second)
}
