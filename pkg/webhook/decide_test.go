package webhook

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

const (
	testDriver = "loopvol.csi.io"
	zoneKey    = "topology.loopvol.csi.io/zone"
	gi         = int64(1 << 30)
)

// fakeCSI answers GetCapacity from a map of pool → response.
type fakeCSI struct {
	pools map[string]*csi.GetCapacityResponse
	err   error
	calls []*csi.GetCapacityRequest
}

func (f *fakeCSI) GetCapacity(_ context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	f.calls = append(f.calls, req)
	if f.err != nil {
		return nil, f.err
	}
	if r, ok := f.pools[req.GetParameters()[parameterPool]]; ok {
		return r, nil
	}
	return &csi.GetCapacityResponse{MaximumVolumeSize: wrapperspb.Int64(0)}, nil
}

func store(t *testing.T, objs ...any) cache.Store {
	t.Helper()
	s := cache.NewStore(cache.MetaNamespaceKeyFunc)
	for _, o := range objs {
		if err := s.Add(o); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func class(name, provisioner, pool string) *storagev1.StorageClass {
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: provisioner}
	if pool != "" {
		sc.Parameters = map[string]string{parameterPool: pool}
	}
	return sc
}

func capObj(name, class, zone string, free int64, maxSize *int64) *storagev1.CSIStorageCapacity {
	c := &storagev1.CSIStorageCapacity{
		ObjectMeta:       metav1.ObjectMeta{Name: name, Namespace: "loopvol"},
		StorageClassName: class,
		NodeTopology:     &metav1.LabelSelector{MatchLabels: map[string]string{zoneKey: zone}},
		Capacity:         resource.NewQuantity(free, resource.BinarySI),
	}
	if maxSize != nil {
		c.MaximumVolumeSize = resource.NewQuantity(*maxSize, resource.BinarySI)
	}
	return c
}

func claim(class string, size int64, volume string) *corev1.PersistentVolumeClaim {
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "app"},
		Spec: corev1.PersistentVolumeClaimSpec{
			VolumeName: volume,
			Resources:  corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(size, resource.BinarySI)}},
		},
	}
	if class != "" {
		pvc.Spec.StorageClassName = ptr.To(class)
	}
	return pvc
}

func volume(name, class, driver, zone string, size int64) *corev1.PersistentVolume {
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			StorageClassName:       class,
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(size, resource.BinarySI)},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: "h"}},
		},
	}
	if zone != "" {
		pv.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: zoneKey, Operator: corev1.NodeSelectorOpIn, Values: []string{zone}}},
		}}}}
	}
	return pv
}

// world is the caches of most cases: class "lv" of the driver in zones a
// (8 Gi free, 6 Gi largest volume) and b (3 Gi free, no maximum), class
// "other" of another driver.
func world(t *testing.T, c *fakeCSI) *decider {
	return &decider{
		driver: testDriver, namespace: "loopvol",
		classes: store(t, class("lv", testDriver, "p"), class("other", "other.example.com", "")),
		volumes: store(t, volume("pv-a", "lv", testDriver, "a", 2*gi), volume("pv-b", "lv", testDriver, "b", 2*gi),
			volume("pv-x", "lv", "other.example.com", "a", 2*gi), volume("pv-anywhere", "lv", testDriver, "", 2*gi)),
		capacities: store(t, capObj("c1", "lv", "a", 8*gi, ptr.To(6*gi)), capObj("c2", "lv", "b", 3*gi, nil)),
		csi:        c,
		csiTimeout: func(ctx context.Context) (context.Context, context.CancelFunc) { return context.WithCancel(ctx) },
	}
}

func TestClaimCreate(t *testing.T) {
	for _, tc := range []struct {
		name string
		pvc  *corev1.PersistentVolumeClaim
		caps []any // replaces the world's capacities when set
		want []string
	}{
		{name: "fits the largest segment", pvc: claim("lv", 6*gi, "")},
		{name: "larger than every segment", pvc: claim("lv", 7*gi, ""),
			want: []string{"largest pool can hold 6Gi (6442450944 bytes); asked 7Gi (7516192768 bytes)", `StorageClass "lv"`, "of its 2 topology segments", "Ask for at most 6Gi"}},
		{name: "no maximum: capacity counts", pvc: claim("lv", 4*gi, ""), caps: []any{capObj("c2", "lv", "b", 3*gi, nil)},
			want: []string{"largest pool can hold 3Gi (3221225472 bytes); asked 4Gi", "of its 1 topology segments"}},
		{name: "another driver's class", pvc: claim("other", 100*gi, "")},
		{name: "unknown class", pvc: claim("nosuch", 100*gi, "")},
		{name: "no class", pvc: claim("", 100*gi, "")},
		{name: "bound to a named volume", pvc: claim("lv", 100*gi, "pv-a")},
		{name: "nothing published", pvc: claim("lv", 100*gi, ""), caps: []any{}},
		{name: "capacity of another class", pvc: claim("lv", 100*gi, ""), caps: []any{capObj("c3", "x", "a", 1, nil)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := world(t, &fakeCSI{})
			if tc.caps != nil {
				d.capacities = store(t, tc.caps...)
			}
			checkVerdict(t, d.claimCreate(tc.pvc), tc.want)
		})
	}
}

func TestClaimExpand(t *testing.T) {
	for _, tc := range []struct {
		name     string
		old, pvc *corev1.PersistentVolumeClaim
		want     []string
	}{
		{name: "fits zone a", old: claim("lv", 2*gi, "pv-a"), pvc: claim("lv", 10*gi, "pv-a")},
		{name: "too much for zone a", old: claim("lv", 2*gi, "pv-a"), pvc: claim("lv", 11*gi, "pv-a"),
			want: []string{"asks for 11Gi", "9Gi (9663676416 bytes) more than its volume pv-a holds (2Gi", "pool of its zone (" + zoneKey + "=a) has 8Gi", "at most 10Gi"}},
		{name: "zone b is smaller", old: claim("lv", 2*gi, "pv-b"), pvc: claim("lv", 6*gi, "pv-b"),
			want: []string{"asks for 6Gi", zoneKey + "=b", "has 3Gi", "at most 5Gi"}},
		{name: "volume everywhere: the largest pool", old: claim("lv", 2*gi, "pv-anywhere"), pvc: claim("lv", 11*gi, "pv-anywhere"),
			want: []string{"has 8Gi", zoneKey + "=a, " + zoneKey + "=b"}},
		{name: "shrinking", old: claim("lv", 20*gi, "pv-a"), pvc: claim("lv", 10*gi, "pv-a")},
		{name: "unchanged request", old: claim("lv", 20*gi, "pv-a"), pvc: claim("lv", 20*gi, "pv-a")},
		{name: "unbound", old: claim("lv", 2*gi, ""), pvc: claim("lv", 100*gi, "")},
		{name: "volume not cached", old: claim("lv", 2*gi, "pv-gone"), pvc: claim("lv", 100*gi, "pv-gone")},
		{name: "another driver's volume", old: claim("lv", 2*gi, "pv-x"), pvc: claim("lv", 100*gi, "pv-x")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkVerdict(t, world(t, &fakeCSI{}).claimExpand(tc.old, tc.pvc), tc.want)
		})
	}
}

func TestClassCreate(t *testing.T) {
	served := map[string]*csi.GetCapacityResponse{
		"p":    {AvailableCapacity: 5 * gi, MaximumVolumeSize: wrapperspb.Int64(5 * gi)},
		"full": {AvailableCapacity: 1, MaximumVolumeSize: wrapperspb.Int64(1)},
	}
	for _, tc := range []struct {
		name      string
		sc        *storagev1.StorageClass
		csi       *fakeCSI
		noCaps    bool
		want      []string
		warn      string
		wantCalls int
	}{
		{name: "served pool", sc: class("n", testDriver, "p"), wantCalls: 1},
		{name: "pool no node serves", sc: class("n", testDriver, "nosuch"), wantCalls: 1,
			want: []string{`no node serves pool "nosuch" of StorageClass n`, "reports 0 bytes", `add pool "nosuch" to the nodes`}},
		{name: "no pool named", sc: class("n", testDriver, "")},
		{name: "another driver", sc: class("n", "other.example.com", "nosuch")},
		{name: "no node reported yet", sc: class("n", testDriver, "nosuch"), noCaps: true,
			warn: `pool "nosuch" of StorageClass n is not checked: no node has reported capacity for loopvol.csi.io yet`},
		{name: "driver unreachable", sc: class("n", testDriver, "nosuch"), csi: &fakeCSI{err: errors.New("connection refused")}, wantCalls: 1,
			warn: "the driver could not be asked: connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.csi
			if c == nil {
				c = &fakeCSI{pools: served}
			}
			d := world(t, c)
			if tc.noCaps {
				d.capacities = store(t)
			}
			v := d.classCreate(context.Background(), tc.sc)
			checkVerdict(t, v, tc.want)
			switch {
			case tc.warn == "" && len(v.warnings) > 0:
				t.Errorf("unexpected warnings %q", v.warnings)
			case tc.warn != "" && (len(v.warnings) != 1 || !strings.Contains(v.warnings[0], tc.warn)):
				t.Errorf("warnings %q, want one with %q", v.warnings, tc.warn)
			}
			if len(c.calls) != tc.wantCalls {
				t.Fatalf("%d GetCapacity calls, want %d", len(c.calls), tc.wantCalls)
			}
			if tc.wantCalls > 0 {
				if p := c.calls[0].GetParameters(); len(p) != 1 || p[parameterPool] != tc.sc.Parameters[parameterPool] || c.calls[0].GetAccessibleTopology() != nil {
					t.Errorf("GetCapacity %v, want only the pool parameter and no topology", c.calls[0])
				}
			}
		})
	}
}

// checkVerdict wants a denial containing every string of want, or (want
// empty) an allowance.
func checkVerdict(t *testing.T, v verdict, want []string) {
	t.Helper()
	if len(want) == 0 {
		if v.reason != "" {
			t.Fatalf("denied: %s", v.reason)
		}
		return
	}
	if v.reason == "" {
		t.Fatalf("allowed, want a denial with %q", want)
	}
	for _, w := range want {
		if !strings.Contains(v.reason, w) {
			t.Errorf("reason %q lacks %q", v.reason, w)
		}
	}
}

// claimOf is claim with the request given as a quantity's text.
func claimOf(class, quantity, volume string) *corev1.PersistentVolumeClaim {
	pvc := claim(class, 0, volume)
	pvc.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse(quantity)
	return pvc
}

// TestSizesBeyondInt64 are the sizes that overflow an int64 of bytes when
// converted (Quantity.Value wraps them to 0 or a negative number): each
// is denied with the size asked and the largest there can be, whether or
// not any capacity is published, on create and on expansion; the largest
// size that fits is judged as ever.
func TestSizesBeyondInt64(t *testing.T) {
	beyond := "a size must be less than 9223372036854775807 bytes (8Ei - 1, the largest a CSI capacity can express)"
	for _, tc := range []struct {
		name   string
		q      string
		noCaps bool
		want   []string // on create; empty: allowed
	}{
		{name: "1e19", q: "1e19", want: []string{"asked 10e18 bytes, more than any volume can be", `PersistentVolumeClaim app/data of StorageClass "lv"`, beyond,
			`the largest pool of StorageClass "lv" can hold 6Gi (6442450944 bytes). Ask for at most 6Gi`}},
		{name: "1e100", q: "1e100", want: []string{"asked 10e99 bytes", beyond}},
		{name: "2^63", q: "9223372036854775808", want: []string{"asked 9223372036854775808 bytes", beyond}},
		{name: "10E", q: "10E", want: []string{"asked 10E bytes", beyond}},
		{name: "8Ei, capped by the parser", q: "8Ei", want: []string{"asked 9223372036854775807 bytes", beyond}},
		{name: "16Ei", q: "16Ei", want: []string{"asked 9223372036854775807 bytes", beyond}},
		{name: "1e19, nothing published", q: "1e19", noCaps: true, want: []string{"asked 10e18 bytes, more than any volume can be", beyond}},
		{name: "largest int64, nothing published", q: "9223372036854775807", noCaps: true, want: []string{beyond}},
		{name: "one below, nothing published: allowed", q: "9223372036854775806", noCaps: true},
		{name: "one below: larger than every pool", q: "9223372036854775806",
			want: []string{"largest pool can hold 6Gi (6442450944 bytes); asked 9223372036854775806"}},
		{name: "fits", q: "6Gi"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := world(t, &fakeCSI{})
			if tc.noCaps {
				d.capacities = store(t)
			}
			v := d.claimCreate(claimOf("lv", tc.q, ""))
			checkVerdict(t, v, tc.want)
			if len(tc.want) > 0 && tc.noCaps && strings.Contains(v.reason, "largest pool") {
				t.Errorf("reason %q names a largest pool, with none published", v.reason)
			}
			t.Logf("%s: %s", tc.q, v.reason)
		})
	}
	t.Run("expansion to 1e19", func(t *testing.T) {
		v := world(t, &fakeCSI{}).claimExpand(claim("lv", 2*gi, "pv-a"), claimOf("lv", "1e19", "pv-a"))
		checkVerdict(t, v, []string{"asks for 10e18 bytes, more than any volume can be: PersistentVolumeClaim app/data, whose volume pv-a holds 2Gi", beyond})
	})
	t.Run("another driver's class: untouched", func(t *testing.T) {
		checkVerdict(t, world(t, &fakeCSI{}).claimCreate(claimOf("other", "1e19", "")), nil)
	})
}
