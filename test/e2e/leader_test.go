package e2e

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
)

// Short leader-election timings, so a takeover takes seconds.
const (
	leaseDuration = 4 * time.Second
	renewDeadline = 3 * time.Second
	retryPeriod   = 1 * time.Second
)

// TestLeaderElection: two attacher replicas with --leader-election share one
// Lease (the upstream name, in the test's namespace). Only the holder acts:
// its log and metrics show the attaches, the other's show none. After the
// leader is killed with SIGKILL (so it cannot release the Lease), the other
// takes the Lease over within the lease duration plus a few seconds and
// attaches new VolumeAttachments, without publishing again those the first
// leader attached.
func TestLeaderElection(t *testing.T) {
	r := newRig(t)
	ns := r.env.Namespace(t)
	node := r.nodeName("a")
	r.createCSINode(node, nodeA)
	const n = 20
	vols := r.createVolumes("le", 2*n)

	args := []string{
		"--leader-election",
		"--leader-election-namespace=" + ns,
		"--leader-election-lease-duration=" + leaseDuration.String(),
		"--leader-election-renew-deadline=" + renewDeadline.String(),
		"--leader-election-retry-period=" + retryPeriod.String(),
	}
	replicas := []*attacher{r.startAttacher("replica-1", args...), r.startAttacher("replica-2", args...)}
	ids := make([]string, len(replicas))
	for i, a := range replicas {
		ids[i] = r.waitIdentity(a)
	}
	holder := r.waitLeaseHolder(ns, func(h string) bool { return h == ids[0] || h == ids[1] }, shortWait)
	leader, follower := replicas[0], replicas[1]
	if holder == ids[1] {
		leader, follower = follower, leader
	}
	followerID := ids[0]
	if holder == ids[0] {
		followerID = ids[1]
	}
	t.Logf("Lease %s/%s held by %s (%s)", ns, leaseName, leader.Name, holder)

	first := r.createVAs(vols[:n], node)
	r.waitVAs("attached by the leader", shortWait, first, attachedTo(nodeA))
	lm, fm := r.scrape(leader.metrics), r.scrape(follower.metrics)
	expectCount(t, "leader's attaches", lm.attaches(), n)
	expectCount(t, "leader's ControllerPublishVolume calls", lm.sidecarCalls(methodPublish, ""), n)
	expectCount(t, "follower's attaches", fm.attaches(), 0)
	expectCount(t, "follower's ControllerPublishVolume calls", fm.sidecarCalls(methodPublish, ""), 0)
	if got := countAttachedLines(leader.Log()); got != n {
		t.Errorf("leader %s logged %d attaches, want %d", leader.Name, got, n)
	}
	if got := countAttachedLines(follower.Log()); got != 0 {
		t.Errorf("follower %s logged %d attaches, want none", follower.Name, got)
	}

	killed := time.Now()
	leader.Kill()
	r.waitLeaseHolder(ns, func(h string) bool { return h == followerID }, leaseDuration+15*time.Second)
	takeover := time.Since(killed)
	t.Logf("Takeover: %s holds the Lease %s after the leader was killed (lease duration %s, retry period %s)",
		follower.Name, takeover.Round(time.Millisecond), leaseDuration, retryPeriod)

	second := r.createVAs(vols[n:], node)
	start := time.Now()
	r.waitVAs("attached by the new leader", shortWait, second, attachedTo(nodeA))
	t.Logf("The new leader attached %d VolumeAttachments in %s", n, time.Since(start).Round(time.Millisecond))
	r.checkPublished("after the takeover", vols, allOn(vols, nodeA))
	fm = r.scrape(follower.metrics)
	expectCount(t, "new leader's attaches (only the new VolumeAttachments)", fm.attaches(), n)
	expectCount(t, "new leader's ControllerPublishVolume calls", fm.sidecarCalls(methodPublish, ""), n)
	expectCount(t, "driver ControllerPublishVolume calls in all", r.scrape(r.driverMetrics).driverCalls(methodPublish, ""), 2*n)

	all := append(first, second...)
	r.deleteVAs(all)
	r.waitVAs("all detached by the new leader", shortWait, all, gone)
	r.checkPublished("after the detaches", vols, nil)
	r.deletePVs(vols)
	r.waitPVsReleased("PersistentVolumes released", vols)
}

var identityRE = regexp.MustCompile(`"Waiting to become the leader".* identity="([^"]+)"`)

// waitIdentity reads a replica's leader-election identity from its log.
func (r *rig) waitIdentity(a *attacher) string {
	r.t.Helper()
	var id string
	err := wait.PollUntilContextTimeout(r.ctx, 100*time.Millisecond, shortWait, true, func(context.Context) (bool, error) {
		if m := identityRE.FindStringSubmatch(a.Log()); m != nil {
			id = m[1]
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		r.t.Fatalf("attacher %s logged no leader-election identity within %s", a.Name, shortWait)
	}
	return id
}

// waitLeaseHolder waits until the attacher Lease in ns has a holder that ok
// accepts, and returns it.
func (r *rig) waitLeaseHolder(ns string, ok func(holder string) bool, timeout time.Duration) string {
	r.t.Helper()
	var holder string
	err := wait.PollUntilContextTimeout(r.ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		lease, err := r.client.CoordinationV1().Leases(ns).Get(ctx, leaseName, metav1.GetOptions{})
		if err != nil {
			return false, nil // not created yet
		}
		holder = ptr.Deref(lease.Spec.HolderIdentity, "")
		return ok(holder), nil
	})
	if err != nil {
		r.t.Fatalf("Lease %s/%s: holder %q after %s, not the one wanted", ns, leaseName, holder, timeout)
	}
	return holder
}

// countAttachedLines counts the attacher's "Attached" log entries (-v=2).
func countAttachedLines(log string) int {
	return strings.Count(log, `] "Attached" `)
}
