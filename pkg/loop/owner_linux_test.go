package loop_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/loopvol/loopvol/pkg/loop"
	"github.com/loopvol/loopvol/pkg/loop/looptest"
)

// Two node plugins on one kernel, as in a test cluster of two kubelets on
// one machine: each owns what it attached.
const (
	ownerA = "node-a"
	ownerB = "node-b"
)

func TestOwnerTag(t *testing.T) {
	long := strings.Repeat("n", 128) // the longest node ID pool.ValidateNodeID allows
	for _, id := range []string{ownerA, ownerB, long} {
		tag := loop.OwnerTag(id)
		if !strings.HasPrefix(tag, "loopvol:") || len(tag) != 24 {
			t.Errorf("OwnerTag(%q) = %q, want loopvol: and 16 hex digits", id, tag)
		}
		if tag != loop.OwnerTag(id) {
			t.Errorf("OwnerTag(%q) differs between calls", id)
		}
	}
	if loop.OwnerTag(ownerA) == loop.OwnerTag(ownerB) {
		t.Errorf("two owners share the tag %q", loop.OwnerTag(ownerA))
	}
	if tag := loop.OwnerTag(""); tag != "" {
		t.Errorf("OwnerTag of no owner = %q, want none", tag)
	}
	if got := loop.New(loop.Owner(ownerA)).Owner(); got != ownerA {
		t.Errorf("Owner() = %q, want %q", got, ownerA)
	}
	if got := loop.New().Owner(); got != "" {
		t.Errorf("Owner() without an owner = %q", got)
	}
}

// attach attaches image through d and fails the test otherwise; the
// device is detached by DirectIODir's cleanup whatever happens.
func attach(t *testing.T, d loop.Devices, image string) string {
	t.Helper()
	dev, err := d.Attach(context.Background(), image, false)
	if err != nil {
		t.Fatalf("Attach %s as %q: %v", image, d.Owner(), err)
	}
	return dev
}

// wantFind checks what owner d finds for image.
func wantFind(t *testing.T, d loop.Devices, image, want string) {
	t.Helper()
	got, ok, err := d.Find(image)
	if err != nil || got != want || ok != (want != "") {
		t.Errorf("Find(%s) as %q = %q, %v, %v; want %q", image, d.Owner(), got, ok, err, want)
	}
}

// TestOwnersOfOneImage: two owners attach the same image; each finds and
// lists its own device only, and neither can detach, resize, tune or read
// the other's, which stays attached and unchanged.
func TestOwnersOfOneImage(t *testing.T) {
	looptest.RequireRoot(t)
	dir := looptest.DirectIODir(t)
	image := newImage(t, dir, "shared.img", 16*mib)
	a, b := loop.New(loop.Owner(ownerA)), loop.New(loop.Owner(ownerB))

	devA := attach(t, a, image)
	wantFind(t, a, image, devA)
	// B has the image attached nowhere, although A has.
	wantFind(t, b, image, "")
	devB := attach(t, b, image)
	if devB == devA {
		t.Fatalf("both owners got %s", devA)
	}
	wantFind(t, a, image, devA)
	wantFind(t, b, image, devB)
	for _, c := range []struct {
		d         loop.Devices
		own, peer string
	}{{a, devA, devB}, {b, devB, devA}} {
		devs, err := c.d.List()
		if err != nil || !slices.Contains(devs, c.own) || slices.Contains(devs, c.peer) {
			t.Errorf("List as %q = %v, %v; want %s and not %s", c.d.Owner(), devs, err, c.own, c.peer)
		}
		st, err := c.d.Status(c.own)
		if err != nil || st.OwnerTag != loop.OwnerTag(c.d.Owner()) || st.BackingFile != image {
			t.Errorf("Status(%s) as %q = %+v, %v; want tagged %s, backed by %s", c.own, c.d.Owner(), st, err, loop.OwnerTag(c.d.Owner()), image)
		}
	}

	// B may not change A's device: grown image, settings A's Tune would
	// change, then every refused call, then A's device as it was.
	f, err := os.OpenFile(image, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = unix.Fallocate(int(f.Fd()), 0, 0, 32*mib)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(queueAttr(t, devA, "queue/scheduler"), "mq-deadline") {
		setQueueAttr(t, devA, "scheduler", "mq-deadline")
	}
	before := queueAttrs(t, devA)
	writeBlock(t, devA, 'a')

	if err := b.Detach(devA); !errors.Is(err, loop.ErrNotOwned) {
		t.Errorf("Detach of A's device as B = %v, want ErrNotOwned", err)
	}
	if err := b.Resize(devA); !errors.Is(err, loop.ErrNotOwned) {
		t.Errorf("Resize of A's device as B = %v, want ErrNotOwned", err)
	}
	if err := b.Tune(devA, false); !errors.Is(err, loop.ErrNotOwned) {
		t.Errorf("Tune of A's device as B = %v, want ErrNotOwned", err)
	}
	if _, err := b.Size(devA); !errors.Is(err, loop.ErrNotOwned) {
		t.Errorf("Size of A's device as B = %v, want ErrNotOwned", err)
	}
	if _, err := b.Status(devA); !errors.Is(err, loop.ErrNotOwned) {
		t.Errorf("Status of A's device as B = %v, want ErrNotOwned", err)
	}
	if err := a.Detach(devB); !errors.Is(err, loop.ErrNotOwned) {
		t.Errorf("Detach of B's device as A = %v, want ErrNotOwned", err)
	}

	if st, err := a.Status(devA); err != nil || st.BackingFile != image || st.OwnerTag != loop.OwnerTag(ownerA) {
		t.Errorf("A's device after B's calls: %+v, %v; want still attached to %s", st, err, image)
	}
	if size, err := a.Size(devA); err != nil || size != 16*mib {
		t.Errorf("A's device size after B's Resize = %d, %v; want still %d", size, err, 16*mib)
	}
	if after := queueAttrs(t, devA); after != before {
		t.Errorf("A's device queue settings after B's Tune = %s, want still %s", after, before)
	}
	if got := readImageByte(t, image); got != 'a' {
		t.Errorf("image byte = %q, want A's 'a'", got)
	}
	if _, err := b.Status(devB); err != nil {
		t.Errorf("B's own device after A's Detach: %v", err)
	}

	// Each detaches its own; the other's stays.
	if err := b.Detach(devB); err != nil {
		t.Fatalf("Detach of B's own device: %v", err)
	}
	wantFind(t, a, image, devA)
	if err := a.Resize(devA); err != nil {
		t.Errorf("Resize of A's own device: %v", err)
	}
	if size, err := a.Size(devA); err != nil || size != 32*mib {
		t.Errorf("A's device size after its Resize = %d, %v; want %d", size, err, 32*mib)
	}
	if err := a.Detach(devA); err != nil {
		t.Fatalf("Detach of A's own device: %v", err)
	}
	wantFind(t, a, image, "")
}

// queueAttrs is what Tune sets on a device, as one string.
func queueAttrs(t *testing.T, dev string) string {
	t.Helper()
	var attrs []string
	for _, a := range []string{"scheduler", "wbt_lat_usec", "discard_max_bytes"} {
		attrs = append(attrs, a+"="+queueAttr(t, dev, "queue/"+a))
	}
	return strings.Join(attrs, " ")
}

// TestUntaggedDevice: a device without an owner tag (what an older loopvol
// attached, here through New without an owner, which writes the image path
// as before) is every owner's: found, listed, resized, tuned and detached
// as before owners existed. An owner's tagged device of the same image
// comes first.
func TestUntaggedDevice(t *testing.T) {
	looptest.RequireRoot(t)
	dir := looptest.DirectIODir(t)
	image := newImage(t, dir, "old.img", 8*mib)
	a, b := loop.New(loop.Owner(ownerA)), loop.New(loop.Owner(ownerB))

	old := attach(t, loop.New(), image)
	if st, err := a.Status(old); err != nil || st.OwnerTag != "" {
		t.Errorf("Status of the untagged device = %+v, %v; want no tag", st, err)
	}
	wantFind(t, a, image, old)
	wantFind(t, b, image, old)
	if devs, err := a.List(); err != nil || !slices.Contains(devs, old) {
		t.Errorf("List as A = %v, %v; want the untagged %s", devs, err, old)
	}
	if err := a.Tune(old, true); err != nil {
		t.Errorf("Tune of the untagged device: %v", err)
	}
	if err := a.Resize(old); err != nil {
		t.Errorf("Resize of the untagged device: %v", err)
	}

	devB := attach(t, b, image)
	wantFind(t, b, image, devB) // its own, not the untagged one
	wantFind(t, a, image, old)
	if err := a.Detach(old); err != nil {
		t.Fatalf("Detach of the untagged device: %v", err)
	}
	wantFind(t, a, image, "")
	wantFind(t, b, image, devB)
	// Without an owner, every device is seen (tools, test cleanups).
	wantFind(t, loop.New(), image, devB)
	if err := loop.New().Detach(devB); err != nil {
		t.Errorf("Detach of B's device without an owner: %v", err)
	}
	wantFind(t, b, image, "")
}
