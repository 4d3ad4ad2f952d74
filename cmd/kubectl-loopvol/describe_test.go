package main

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// waitingLine is the Waiting: line of describe's output, "" if none.
func waitingLine(out string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "Waiting:") {
			return strings.TrimSpace(strings.TrimPrefix(l, "Waiting:"))
		}
	}
	return ""
}

func TestDescribeWaiting(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(f *fixture)
		args   []string
		// want starts the Waiting line; "" wants none.
		want string
	}{
		{name: "no pool has the space → for space", args: []string{"describe", "pvc", "big"},
			want: "for space: no pool has 2199023255552 bytes available (ProvisioningFailed, ResourceExhausted, 4m ago)"},
		{name: "pool error in the message → for space", args: []string{"describe", "pvc", "big"},
			change: func(f *fixture) {
				f.remove("Event", "big.provisioningfailed.4")
				f.add(event("default", "big", "PersistentVolumeClaim", "Warning", "ProvisioningFailed",
					"failed to provision volume with StorageClass \"loopvol\": create image: not enough space in pool", 1))
			},
			want: "for space: failed to provision volume with StorageClass \"loopvol\": create image: not enough space in pool"},
		{name: "scheduler found no node with the storage → for space", args: []string{"describe", "pvc", "big"},
			change: func(f *fixture) {
				f.remove("Event", "big.provisioningfailed.4")
				f.add(event("default", "importer", "Pod", "Warning", "FailedScheduling",
					"0/3 nodes are available: 3 node(s) did not have enough free storage.", 1))
			},
			want: "for space: no node has the storage Pod importer asks for"},
		{name: "provisioning failed otherwise → for provisioning", args: []string{"describe", "pvc", "big"},
			change: func(f *fixture) {
				f.remove("Event", "big.provisioningfailed.4")
				f.add(event("default", "big", "PersistentVolumeClaim", "Warning", "ProvisioningFailed",
					"failed to provision volume with StorageClass \"loopvol\": rpc error: code = InvalidArgument desc = parameter fsType: \"zfs\" is not offered", 1))
			},
			want: "for provisioning, which failed: parameter fsType: \"zfs\" is not offered (ProvisioningFailed, InvalidArgument, 60s ago)"},
		{name: "WaitForFirstConsumer, no Pod → for a Pod", args: []string{"describe", "pvc", "scratch"},
			want: "for a Pod to use it: class loopvol binds WaitForFirstConsumer"},
		{name: "class missing → for the class", args: []string{"describe", "pvc", "scratch"},
			change: func(f *fixture) { f.remove("StorageClass", "loopvol") },
			want:   "for StorageClass loopvol, which does not exist"},
		{name: "attach failed → for attach with its error", args: []string{"describe", "pvc", "logs-web-0"},
			want: "for attach to worker-2, which failed: rpc error: code = ResourceExhausted"},
		{name: "attached, mount failing → for mount", args: []string{"describe", "pod", "logs-0"},
			change: func(f *fixture) {
				f.remove("VolumeAttachment", "csi-9a8b7c6d5e")
				f.add(va("csi-9a8b7c6d5e", logsPV, "worker-2", true, ""),
					event("default", "logs-0", "Pod", "Warning", "FailedMount", "MountVolume.MountDevice failed for volume \""+logsPV+"\" : rpc error: code = Internal desc = mkfs failed", 1))
			},
			want: "for mount on worker-2: MountVolume.MountDevice failed"},
		{name: "no VolumeAttachment yet → for one", args: []string{"describe", "pvc", "logs-web-0"},
			change: func(f *fixture) { f.remove("VolumeAttachment", "csi-9a8b7c6d5e") },
			want:   "for a VolumeAttachment of " + logsPV + " to worker-2"},
		{name: "running → nothing waits", args: []string{"describe", "pvc", "data-web-0"}},
		{name: "Pod of a running claim → nothing waits", args: []string{"describe", "pod", "web-0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			if tc.change != nil {
				tc.change(f)
			}
			out, stderr, code := f.run(t, "default", false, tc.args...)
			if code != 0 {
				t.Fatalf("exit code %d; stderr: %s", code, stderr)
			}
			got := waitingLine(out)
			if tc.want == "" && got != "" || !strings.HasPrefix(got, tc.want) {
				t.Errorf("Waiting: %q, want it to start with %q; output:\n%s", got, tc.want, out)
			}
			if n := strings.Count(out, "\nWaiting:"); n > 1 {
				t.Errorf("%d Waiting lines, want at most one per claim", n)
			}
		})
	}
}

func TestDescribePodSkipsOtherDrivers(t *testing.T) {
	f := newFixture(t)
	other := claim("default", "cache", "standard", "1Gi", "pvc-other")
	otherPV := pv("pvc-other", "default", "cache", "vol-1", "1Gi")
	otherPV.Spec.CSI.Driver = "ebs.csi.aws.com"
	f.add(other, otherPV, pod("default", "mixed", "worker-1", corev1.PodRunning, "data-web-0", "cache"))
	out, stderr, code := f.run(t, "default", false, "describe", "pod", "mixed")
	if code != 0 {
		t.Fatalf("exit code %d; stderr: %s", code, stderr)
	}
	if !strings.Contains(out, "Claim:          default/data-web-0") || strings.Contains(out, "default/cache") {
		t.Errorf("want only the loopvol claim described; got:\n%s", out)
	}
}

// TestDescribeLongAttachmentName: a VolumeAttachment named as the
// attach/detach controller names them (csi- and 64 hex digits) and a node
// name of its length still fit 100 columns: the node goes to a line of its
// own.
func TestDescribeLongAttachmentName(t *testing.T) {
	f := newFixture(t)
	long := "csi-" + strings.Repeat("5e4d3c2b1a", 6) + "5e4d"
	f.remove("VolumeAttachment", "csi-5e4d3c2b1a")
	f.add(va(long, webPV, "worker-1", true, ""))
	out, stderr, code := f.run(t, "default", false, "describe", "pvc", "data-web-0")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	checkScreen(t, out, func(line string) bool { return strings.Contains(line, "  /") })
	if !strings.Contains(out, long+": attached to") || !strings.Contains(out, "worker-1") {
		t.Errorf("describe lost the attachment's name or node:\n%s", out)
	}
}
