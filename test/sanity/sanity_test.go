// Package sanity runs csi-sanity against the real driver binary with real
// loop devices and mounts: once per volume shape (ext4, xfs, raw block), each
// in a process of its own because Ginkgo runs one suite per process.
package sanity

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/loopvol/loopvol/test/internal/driverproc"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"

	"github.com/loopvol/loopvol/internal/harness/testfs"
)

// contextEnv selects the shape when the test binary re-runs itself.
const contextEnv = "LOOPVOL_SANITY_CONTEXT"

// poolFSEnv selects, in the child, the pool's filesystem: "" for the test's
// own, "xfs-reflink" for an xfs with reflink=1 that the child makes in a
// sparse file and loop-mounts.
const poolFSEnv = "LOOPVOL_SANITY_POOL_FS"

// maxVolumes is the node limit under test; small, so that csi-sanity's limit
// check (publish N, the N+1th fails) stays quick.
const maxVolumes = 4

func TestMain(m *testing.M) {
	code := m.Run()
	driverproc.Cleanup()
	os.Exit(code)
}

// TestSanity runs each shape in a child process and reports its summary.
func TestSanity(t *testing.T) {
	if os.Getenv(contextEnv) != "" {
		t.Skip("child process")
	}
	driverproc.RequireRoot(t)
	driverproc.Binary(t) // build once, before the children need it
	// Each shape with the pool on the test's filesystem (ext4 here: the
	// snapshot copy path) and on a loop-mounted xfs with reflink=1 (the
	// reflink path).
	for _, poolFS := range []string{"", "xfs-reflink"} {
		for _, shape := range []string{"ext4", "xfs", "block"} {
			name := shape
			if poolFS != "" {
				name += "/pool-on-" + poolFS
			}
			runShape(t, name, shape, poolFS)
		}
	}
}

func runShape(t *testing.T, name, shape, poolFS string) {
	t.Run(name, func(t *testing.T) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSanityShape$", "-test.v", "-ginkgo.skip="+upstreamBroken)
		cmd.Env = append(os.Environ(), contextEnv+"="+shape, poolFSEnv+"="+poolFS)
		out, err := cmd.CombinedOutput()
		summary := ""
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "sanity:") {
				summary += line + "\n"
			}
		}
		t.Logf("csi-sanity %s:\n%s", shape, summary)
		fmt.Print(summary)
		if err != nil {
			t.Fatalf("csi-sanity %s failed: %v\n%s", shape, err, lastLines(string(out), 200))
		}
		if summary == "" {
			t.Fatalf("csi-sanity %s printed no summary:\n%s", shape, lastLines(string(out), 100))
		}
	})
}

// upstreamBroken is the one csi-sanity spec that no driver reporting a
// snapshot's topology can pass; see whyNotApplicable.
const upstreamBroken = "should succeed when creating a snapshot with accessibility requirements"

// TestSanityShape is the child: one csi-sanity run against one driver.
func TestSanityShape(t *testing.T) {
	shape := os.Getenv(contextEnv)
	if shape == "" {
		t.Skip("run through TestSanity")
	}
	driverproc.RequireRoot(t)
	dir := t.TempDir()
	kubelet := filepath.Join(dir, "kubelet")
	poolDir := filepath.Join(dir, "pool")
	for _, d := range []string{filepath.Join(kubelet, "pods"), filepath.Join(kubelet, "plugins"), poolDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	if os.Getenv(poolFSEnv) == "xfs-reflink" {
		testfs.MountReflinkXFS(t, filepath.Join(dir, "pool.xfs"), poolDir, 32<<30)
	}
	fs := "ext4"
	if shape == "xfs" {
		fs = "xfs"
	}
	d := driverproc.Start(t, dir, "--mode=all", "--node-id=sanity-node", "--zone=z1",
		"--pool=sanity="+poolDir, "--kubelet-dir="+kubelet, "--default-fstype="+fs,
		fmt.Sprintf("--max-volumes-per-node=%d", maxVolumes))
	t.Cleanup(func() {
		// Whatever a failed spec left: the driver is stopped by now (cleanups
		// run last-in first-out), so unmount and detach by hand.
		for _, line := range driverproc.Mounts(dir) {
			if f := strings.Fields(line); len(f) > 4 {
				exec.Command("umount", "-l", f[4]).Run()
			}
		}
		for _, dev := range driverproc.LoopDevicesOf(dir) {
			exec.Command("losetup", "-d", dev).Run()
		}
	})

	cfg := sanity.NewTestConfig()
	cfg.Address = d.Endpoint
	cfg.TargetPath = filepath.Join(kubelet, "pods", "sanity-target")
	cfg.StagingPath = filepath.Join(kubelet, "plugins", "sanity-staging")
	cfg.TestVolumeSize = 512 << 20 // above xfs' 300 MiB minimum, small enough for the limit test
	cfg.TestVolumeExpandSize = 768 << 20
	cfg.IdempotentCount = 2
	cfg.TestNodeVolumeAttachLimit = true
	cfg.TestVolumeParameters = map[string]string{"pool": "sanity"}
	// --csi.testvolumemutableparameters: the modify specs create volumes
	// thick (no mutable parameters) and thin (these), and modify both to
	// thin, so the thinning of a detached volume runs for real.
	cfg.TestVolumeMutableParameters = map[string]string{"preallocate": "false"}
	if shape == "block" {
		cfg.TestVolumeAccessType = "block"
	}
	sanity.Test(t, cfg)
}

// The summary: how many specs ran, passed and were skipped, and why each
// skipped one does not apply (the skip message csi-sanity gives).
var _ = ginkgo.ReportAfterSuite("loopvol sanity summary", func(r ginkgo.Report) {
	ran, passed, failed, skipped := 0, 0, 0, 0
	reasons := map[string]int{}
	for _, s := range r.SpecReports {
		if s.LeafNodeType != types.NodeTypeIt {
			continue
		}
		switch s.State {
		case types.SpecStatePassed:
			ran++
			passed++
		case types.SpecStateSkipped, types.SpecStatePending:
			skipped++
			msg := s.Failure.Message
			switch {
			case s.State == types.SpecStatePending:
				msg = "pending in csi-sanity itself"
			case strings.Contains(s.LeafNodeText, upstreamBroken):
				msg = "upstream-broken: " + s.LeafNodeText
			}
			reasons[msg]++
		default:
			ran++
			failed++
		}
	}
	shape := os.Getenv(contextEnv)
	if pfs := os.Getenv(poolFSEnv); pfs != "" {
		shape += " (pool on " + pfs + ")"
	}
	fmt.Printf("\nsanity: %s: %d specs ran, %d passed, %d failed, %d skipped\n", shape, ran, passed, failed, skipped)
	var keys []string
	for k := range reasons {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Printf("sanity: %s: skipped %d: %s — %s\n", shape, reasons[k], k, whyNotApplicable(k))
	}
})

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// whyNotApplicable explains, for the summary, why a spec csi-sanity skipped
// does not apply to loopvol.
func whyNotApplicable(skipMessage string) string {
	m := strings.ToLower(skipMessage)
	switch {
	case strings.HasPrefix(m, "upstream-broken"):
		return "skipped with -ginkgo.skip: the spec compares the returned topology with the requested one by reflect.DeepEqual " +
			"(gomega Equal) on protobuf messages; the requested one was marshalled and carries a size cache, the returned one does not, " +
			"so it fails for any driver that reports where its snapshot is (the spec's own check, every returned topology is a requisite one, " +
			"is tested with proto.Equal in pkg/controller TestSnapshotTopology)"
	case strings.Contains(m, "pending"):
		return "marked pending (XIt) upstream, never runs"
	}
	return "capability not offered"
}
