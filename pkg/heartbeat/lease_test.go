package heartbeat

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

const (
	testDriver = "loopvol.csi.io"
	testNS     = "kube-system"
)

// testNow is the time of the tests' fake clocks.
var testNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// eventually polls cond (in real time: the code under test runs in
// goroutines of its own) until it holds, or fails the test after 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10s: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestLeaseName(t *testing.T) {
	long := strings.Repeat("n", 300)
	for _, tc := range []struct {
		name, nodeID string
		want         string // "" to check only validity
		wantPrefix   string
	}{
		{name: "short node name → as it is", nodeID: "node-a", want: "heartbeat-loopvol-csi-io-node-a"},
		{name: "host name with dots → as it is", nodeID: "ip-10-0-0-1.ec2.internal", want: "heartbeat-loopvol-csi-io-ip-10-0-0-1.ec2.internal"},
		{name: "upper case and underscore → lower-cased, hashed", nodeID: "Node_A", wantPrefix: "heartbeat-loopvol-csi-io-node-a-"},
		{name: "nothing usable → prefix and hash", nodeID: "___", wantPrefix: "heartbeat-loopvol-csi-io-"},
		{name: "not ASCII → hashed", nodeID: "knoten-ü", wantPrefix: "heartbeat-loopvol-csi-io-knoten-"},
		{name: "too long → cut and hashed", nodeID: long, wantPrefix: "heartbeat-loopvol-csi-io-nnnn"},
		{name: "exactly fits → as it is", nodeID: strings.Repeat("m", 253-len("heartbeat-loopvol-csi-io-")), want: "heartbeat-loopvol-csi-io-" + strings.Repeat("m", 253-len("heartbeat-loopvol-csi-io-"))},
		{name: "one too long → hashed", nodeID: strings.Repeat("m", 254-len("heartbeat-loopvol-csi-io-")), wantPrefix: "heartbeat-loopvol-csi-io-mmm"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := LeaseName(testDriver, tc.nodeID)
			if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
				t.Fatalf("LeaseName(%q) = %q, not a valid name: %v", tc.nodeID, got, errs)
			}
			if tc.want != "" && got != tc.want {
				t.Errorf("LeaseName(%q) = %q, want %q", tc.nodeID, got, tc.want)
			}
			if tc.wantPrefix != "" && (!strings.HasPrefix(got, tc.wantPrefix) || len(got) < len(tc.wantPrefix)+nameHashLen) {
				t.Errorf("LeaseName(%q) = %q, want %q, a readable part and a hash", tc.nodeID, got, tc.wantPrefix)
			}
			if again := LeaseName(testDriver, tc.nodeID); again != got {
				t.Errorf("not deterministic: %q then %q", got, again)
			}
		})
	}

	// Node IDs that differ only where the readable form loses it get
	// different names, and so do two drivers.
	seen := map[string]string{}
	for _, id := range []string{"node-a", "Node-A", "node_a", "NODE_A", "node.a", long, long + "x"} {
		n := LeaseName(testDriver, id)
		if other, ok := seen[n]; ok {
			t.Errorf("node IDs %q and %q share the Lease name %q", other, id, n)
		}
		seen[n] = id
	}
	if LeaseName("Other.CSI.io", "Node_A") == LeaseName("other.csi.io", "Node_A") {
		t.Error("two drivers' hashed names are the same")
	}
}

func TestLeaseSeconds(t *testing.T) {
	for d, want := range map[time.Duration]int32{2 * time.Second: 2, 2500 * time.Millisecond: 3, time.Millisecond: 1, 20 * time.Second: 20} {
		if got := leaseSeconds(d); got != want {
			t.Errorf("leaseSeconds(%s) = %d, want %d (rounded up: never promise more than is kept)", d, got, want)
		}
	}
}
