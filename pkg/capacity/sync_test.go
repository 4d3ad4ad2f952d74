package capacity

import (
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/loopvol/loopvol/internal/kube/kubetest"
	"github.com/loopvol/loopvol/pkg/csiclient"
)

// zoneTopology is the nodeTopology of a zone in describe's form.
func zoneTopology(zone string) string {
	if zone == "" {
		return "{}"
	}
	return `{"matchLabels":{"` + zoneKey + `":"` + zone + `"}}`
}

// desc is describe's form of an object the controller creates.
func desc(sc, zone, capacity, max, managed, owners string) string {
	return "generateName=csisc- ns=" + ns + " class=" + sc + " topology=" + zoneTopology(zone) + " capacity=" + capacity + " max=" + max +
		" managedBy=" + managed + " driver=" + driver + " owners=" + owners
}

// descExisting is describe's form of an object made by object().
func descExisting(sc, zone, capacity, max, owners string) string {
	return "generateName= ns=" + ns + " class=" + sc + " topology=" + zoneTopology(zone) + " capacity=" + capacity + " max=" + max +
		" managedBy=external-provisioner driver=" + driver + " owners=" + owners
}

// twoZones is a cluster of three nodes in zones z1, z2, z1 where the
// driver runs with the zone as its topology key.
func twoZones() []runtime.Object {
	return []runtime.Object{
		node("n1", "z1"), csiNode("n1", zoneKey),
		node("n2", "z2"), csiNode("n2", zoneKey),
		node("n3", "z1"), csiNode("n3", zoneKey),
	}
}

func with(objs []runtime.Object, more ...runtime.Object) []runtime.Object {
	return append(append([]runtime.Object{}, objs...), more...)
}

func TestInitialSync(t *testing.T) {
	const ep = "external-provisioner"
	tests := []struct {
		name      string
		caps      csiclient.Capabilities
		opts      []option
		noMax     bool
		objs      []runtime.Object
		wantCalls []getCapacityCall
		// wantWrites lists creates by content, patches and deletes by name.
		wantWrites []apiAction
		// wantObjects is the API server's objects afterwards; those created
		// are matched by content (names are generated).
		wantObjects []string
	}{
		{
			name:      "a class, nodes in two zones → one object per zone with the driver's figures",
			objs:      with(twoZones(), class("fast")),
			wantCalls: []getCapacityCall{{Pool: "fast-pool", Zone: "z1"}, {Pool: "fast-pool", Zone: "z2"}},
			wantWrites: []apiAction{
				create(desc("fast", "z1", "10Gi", "5Gi", ep, "")),
				create(desc("fast", "z2", "20Gi", "10Gi", ep, "")),
			},
			wantObjects: []string{desc("fast", "z1", "10Gi", "5Gi", ep, ""), desc("fast", "z2", "20Gi", "10Gi", ep, "")},
		},
		{
			name: "an Immediate class → nothing, the scheduler does not read it",
			objs: with(twoZones(), class("now", immediate)),
		},
		{
			name:      "an Immediate class with --capacity-for-immediate-binding → its objects",
			opts:      []option{withImmediate},
			objs:      with(twoZones(), class("now", immediate)),
			wantCalls: []getCapacityCall{{Pool: "now-pool", Zone: "z1"}, {Pool: "now-pool", Zone: "z2"}},
			wantWrites: []apiAction{
				create(desc("now", "z1", "10Gi", "5Gi", ep, "")),
				create(desc("now", "z2", "20Gi", "10Gi", ep, "")),
			},
			wantObjects: []string{desc("now", "z1", "10Gi", "5Gi", ep, ""), desc("now", "z2", "20Gi", "10Gi", ep, "")},
		},
		{
			name: "a class of another driver → nothing",
			objs: with(twoZones(), class("theirs", provisioner("other.csi.io"))),
		},
		{
			name: "a node without the zone label, a CSINode without a Node, a Node without the driver → only z1",
			objs: []runtime.Object{
				node("n1", "z1"), csiNode("n1", zoneKey),
				node("n2", ""), csiNode("n2", zoneKey),
				csiNode("n4", zoneKey),
				node("n5", "z5"),
				class("fast"),
			},
			wantCalls:   []getCapacityCall{{Pool: "fast-pool", Zone: "z1"}},
			wantWrites:  []apiAction{create(desc("fast", "z1", "10Gi", "5Gi", ep, ""))},
			wantObjects: []string{desc("fast", "z1", "10Gi", "5Gi", ep, "")},
		},
		{
			name: "upstream's objects with the same figures → adopted, no write",
			objs: with(twoZones(), class("fast"),
				object("csisc-up1", "fast", "z1", 10*gi, 5*gi), object("csisc-up2", "fast", "z2", 20*gi, 10*gi)),
			wantCalls:   []getCapacityCall{{Pool: "fast-pool", Zone: "z1"}, {Pool: "fast-pool", Zone: "z2"}},
			wantObjects: []string{descExisting("fast", "z1", "10Gi", "5Gi", ""), descExisting("fast", "z2", "20Gi", "10Gi", "")},
		},
		{
			name: "an object with old figures → one merge patch of the figures only",
			objs: with(twoZones(), class("fast"),
				object("csisc-up1", "fast", "z1", 3*gi, 1*gi), object("csisc-up2", "fast", "z2", 20*gi, 10*gi)),
			wantCalls:   []getCapacityCall{{Pool: "fast-pool", Zone: "z1"}, {Pool: "fast-pool", Zone: "z2"}},
			wantWrites:  []apiAction{patch("csisc-up1", `{"capacity":"10Gi","maximumVolumeSize":"5Gi"}`)},
			wantObjects: []string{descExisting("fast", "z1", "10Gi", "5Gi", ""), descExisting("fast", "z2", "20Gi", "10Gi", "")},
		},
		{
			name:  "a maximumVolumeSize the driver no longer reports → removed",
			noMax: true,
			objs: with(twoZones(), class("fast"),
				object("csisc-up1", "fast", "z1", 10*gi, 5*gi), object("csisc-up2", "fast", "z2", 20*gi, -1)),
			wantCalls:   []getCapacityCall{{Pool: "fast-pool", Zone: "z1"}, {Pool: "fast-pool", Zone: "z2"}},
			wantWrites:  []apiAction{patch("csisc-up1", `{"maximumVolumeSize":null}`)},
			wantObjects: []string{descExisting("fast", "z1", "10Gi", "<none>", ""), descExisting("fast", "z2", "20Gi", "<none>", "")},
		},
		{
			name: "duplicates → the oldest kept, the others deleted",
			objs: with(twoZones(), class("fast"),
				object("csisc-b", "fast", "z1", 10*gi, 5*gi, createdAt(testNow.Add(-2*time.Hour))),
				object("csisc-a", "fast", "z1", 10*gi, 5*gi),
				object("csisc-c", "fast", "z1", 10*gi, 5*gi),
				object("csisc-z2", "fast", "z2", 20*gi, 10*gi)),
			wantCalls:   []getCapacityCall{{Pool: "fast-pool", Zone: "z1"}, {Pool: "fast-pool", Zone: "z2"}},
			wantWrites:  []apiAction{deleteAction("csisc-a"), deleteAction("csisc-c")},
			wantObjects: []string{descExisting("fast", "z1", "10Gi", "5Gi", ""), descExisting("fast", "z2", "20Gi", "10Gi", "")},
		},
		{
			name: "objects of a vanished class, a vanished zone and a selector that is no segment → deleted",
			objs: with(twoZones(), class("fast"),
				object("csisc-gone-class", "slow", "z1", 1, 1),
				object("csisc-gone-zone", "fast", "z9", 1, 1),
				object("csisc-expr", "fast", "z1", 1, 1, func(o *storagev1.CSIStorageCapacity) {
					o.NodeTopology = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: zoneKey, Operator: metav1.LabelSelectorOpIn, Values: []string{"z1"}}}}
				}),
				object("csisc-nil", "fast", "z2", 1, 1, func(o *storagev1.CSIStorageCapacity) { o.NodeTopology = nil })),
			wantCalls: []getCapacityCall{{Pool: "fast-pool", Zone: "z1"}, {Pool: "fast-pool", Zone: "z2"}},
			wantWrites: []apiAction{
				// Each segment as it appears (with the objects in it),
				// then every other item, by class and segment.
				create(desc("fast", "z1", "10Gi", "5Gi", ep, "")),
				deleteAction("csisc-gone-class"),
				create(desc("fast", "z2", "20Gi", "10Gi", ep, "")),
				deleteAction("csisc-expr"), deleteAction("csisc-nil"), deleteAction("csisc-gone-zone"),
			},
			wantObjects: []string{desc("fast", "z1", "10Gi", "5Gi", ep, ""), desc("fast", "z2", "20Gi", "10Gi", ep, "")},
		},
		{
			name: "an owner: an object of another controller gets ours in its place (resourceVersion precondition), other references stay",
			opts: []option{withOwner(ourOwner)},
			objs: with(twoZones(), class("fast"),
				object("csisc-up1", "fast", "z1", 10*gi, 5*gi, ownedBy(oldOwner), ownedBy(metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "keep", UID: "uid-cm"}))),
			wantCalls: []getCapacityCall{{Pool: "fast-pool", Zone: "z1"}, {Pool: "fast-pool", Zone: "z2"}},
			wantWrites: []apiAction{
				patch("csisc-up1", `{"metadata":{"resourceVersion":"1","ownerReferences":[`+
					`{"apiVersion":"v1","kind":"ConfigMap","name":"keep","uid":"uid-cm"},`+
					`{"apiVersion":"apps/v1","kind":"StatefulSet","name":"loopvol-controller","uid":"uid-sts","controller":true}]}}`),
				create(desc("fast", "z2", "20Gi", "10Gi", ep, "StatefulSet/loopvol-controller(controller=true)")),
			},
			wantObjects: []string{
				descExisting("fast", "z1", "10Gi", "5Gi", "ConfigMap/keep(controller=false),StatefulSet/loopvol-controller(controller=true)"),
				desc("fast", "z2", "20Gi", "10Gi", ep, "StatefulSet/loopvol-controller(controller=true)"),
			},
		},
		{
			name: "an owner: of duplicates, the one already ours is kept even when younger",
			opts: []option{withOwner(ourOwner)},
			objs: with(twoZones(), class("fast"),
				object("csisc-old", "fast", "z1", 10*gi, 5*gi, createdAt(testNow.Add(-5*time.Hour)), ownedBy(oldOwner)),
				object("csisc-ours", "fast", "z1", 10*gi, 5*gi, ownedBy(ourOwner)),
				object("csisc-z2", "fast", "z2", 20*gi, 10*gi, ownedBy(ourOwner))),
			wantCalls:  []getCapacityCall{{Pool: "fast-pool", Zone: "z1"}, {Pool: "fast-pool", Zone: "z2"}},
			wantWrites: []apiAction{deleteAction("csisc-old")},
			wantObjects: []string{
				descExisting("fast", "z1", "10Gi", "5Gi", "StatefulSet/loopvol-controller(controller=true)"),
				descExisting("fast", "z2", "20Gi", "10Gi", "StatefulSet/loopvol-controller(controller=true)"),
			},
		},
		{
			name:        "a driver without topology → one object with an empty nodeTopology, GetCapacity without accessible_topology",
			caps:        csiclient.Capabilities{ControllerService: true, GetCapacity: true},
			objs:        with(twoZones(), class("fast")),
			wantCalls:   []getCapacityCall{{Pool: "fast-pool", Zone: "-"}},
			wantWrites:  []apiAction{create(desc("fast", "", "30Gi", "15Gi", ep, ""))},
			wantObjects: []string{desc("fast", "", "30Gi", "15Gi", ep, "")},
		},
		{
			name:       "--node-deployment → the node's own segment only, managed by external-provisioner-<node>; the central objects are not its own",
			opts:       []option{withNode("n1")},
			objs:       with(twoZones(), class("fast"), object("csisc-central", "fast", "z2", 1, 1)),
			wantCalls:  []getCapacityCall{{Pool: "fast-pool", Zone: "z1"}},
			wantWrites: []apiAction{create(desc("fast", "z1", "10Gi", "5Gi", ep+"-n1", ""))},
			wantObjects: []string{
				descExisting("fast", "z2", "1", "1", ""),
				desc("fast", "z1", "10Gi", "5Gi", ep+"-n1", ""),
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			caps := tc.caps
			if caps == (csiclient.Capabilities{}) {
				caps = topoCaps
			}
			f := newFixture(t, caps, tc.objs, tc.opts...)
			f.csi.noMax = tc.noMax
			f.drain()
			kubetest.Diff(t, "GetCapacity calls", tc.wantCalls, f.csi.TakeCalls())
			kubetest.Diff(t, "API writes", tc.wantWrites, f.writes())
			kubetest.Diff(t, "objects", sortedValues(tc.wantObjects), sortedValues(mapValues(f.state())))

			// Nothing changed: a poll asks the driver again and writes nothing.
			f.c.enqueueAll()
			f.drain()
			if len(tc.wantObjects) > 0 && len(f.csi.TakeCalls()) == 0 {
				t.Error("the poll did not ask the driver")
			}
			kubetest.Diff(t, "API writes of a poll with nothing changed", []apiAction(nil), f.writes())
		})
	}
}
