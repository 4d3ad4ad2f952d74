package looptest_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/loopvol/loopvol/pkg/loop"
	"github.com/loopvol/loopvol/pkg/loop/looptest"
)

// TestFakeOwners: the fake's owners behave as loop.Devices' do (pkg/loop
// TestOwnersOfOneImage and TestUntaggedDevice on real devices).
func TestFakeOwners(t *testing.T) {
	image := filepath.Join(t.TempDir(), "vol.img")
	if err := os.WriteFile(image, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a := looptest.New("node-a")
	b, machine := a.Peer("node-b"), a.Peer("")

	devA, err := a.Attach(ctx, image, false)
	if err != nil {
		t.Fatal(err)
	}
	if dev, ok, err := b.Find(image); err != nil || ok {
		t.Errorf("B finds %q, %v, %v; want nothing of A's", dev, ok, err)
	}
	devB, err := b.Attach(ctx, image, false)
	if err != nil || devB == devA {
		t.Fatalf("B's Attach = %q, %v; want a device of its own", devB, err)
	}
	for _, c := range []struct {
		f         *looptest.Fake
		own, peer string
	}{{a, devA, devB}, {b, devB, devA}} {
		if dev, ok, err := c.f.Find(image); err != nil || !ok || dev != c.own {
			t.Errorf("%s finds %q, %v, %v; want %s", c.f.Owner(), dev, ok, err, c.own)
		}
		if devs, err := c.f.List(); err != nil || !slices.Equal(devs, []string{c.own}) {
			t.Errorf("%s lists %v, %v; want [%s]", c.f.Owner(), devs, err, c.own)
		}
		if st, err := c.f.Status(c.own); err != nil || st.OwnerTag != loop.OwnerTag(c.f.Owner()) {
			t.Errorf("%s's Status of its device = %+v, %v", c.f.Owner(), st, err)
		}
		for name, call := range map[string]func(string) error{
			"Detach": c.f.Detach,
			"Resize": c.f.Resize,
			"Tune":   func(dev string) error { return c.f.Tune(dev, false) },
			"Size":   func(dev string) error { _, err := c.f.Size(dev); return err },
			"Status": func(dev string) error { _, err := c.f.Status(dev); return err },
		} {
			if err := call(c.peer); !errors.Is(err, loop.ErrNotOwned) {
				t.Errorf("%s's %s of %s = %v, want ErrNotOwned", c.f.Owner(), name, c.peer, err)
			}
		}
	}
	if got := len(machine.Attached()); got != 2 {
		t.Errorf("%d devices attached after the refused calls, want both", got)
	}

	// An untagged device is everyone's; an owner's own device comes first.
	old, err := machine.Attach(ctx, image, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Detach(devB); err != nil {
		t.Fatal(err)
	}
	if dev, ok, err := b.Find(image); err != nil || !ok || dev != old {
		t.Errorf("B finds %q, %v, %v; want the untagged %s", dev, ok, err, old)
	}
	if dev, _, _ := a.Find(image); dev != devA {
		t.Errorf("A finds %q, want its own %s before the untagged %s", dev, devA, old)
	}
	if err := b.Resize(old); err != nil {
		t.Errorf("B's Resize of the untagged device: %v", err)
	}
}

// TestFakeReplaced: a file renamed over an attached image replaces it as on
// a kernel (pkg/loop TestFindReplaced on real devices).
func TestFakeReplaced(t *testing.T) {
	dir := t.TempDir()
	image := filepath.Join(dir, "vol.img")
	if err := os.WriteFile(image, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a := looptest.New("node-a")
	b, machine := a.Peer("node-b"), a.Peer("")
	old, err := a.Attach(ctx, image, false)
	if err != nil {
		t.Fatal(err)
	}
	untagged, err := machine.Attach(ctx, image, false)
	if err != nil {
		t.Fatal(err)
	}
	if devs, err := a.FindReplaced(image); err != nil || len(devs) != 0 {
		t.Errorf("FindReplaced before the replacement = %v, %v; want none", devs, err)
	}
	if err := os.WriteFile(image+".new", make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(image+".new", image); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		f    *looptest.Fake
		want []string
	}{{a, []string{old}}, {b, nil}, {machine, []string{old, untagged}}} {
		if devs, err := c.f.FindReplaced(image); err != nil || !slices.Equal(devs, c.want) {
			t.Errorf("FindReplaced as %q = %v, %v; want %v", c.f.Owner(), devs, err, c.want)
		}
	}
	if dev, ok, err := a.Find(image); err != nil || ok {
		t.Errorf("Find after the replacement = %q, %v, %v; want nothing", dev, ok, err)
	}
	if st, err := a.Status(old); err != nil || !st.Deleted {
		t.Errorf("Status of the replaced device = %+v, %v; want deleted", st, err)
	}
	current, err := a.Attach(ctx, image, false)
	if err != nil {
		t.Fatal(err)
	}
	if dev, ok, err := a.Find(image); err != nil || !ok || dev != current {
		t.Errorf("Find of the new image = %q, %v, %v; want %s", dev, ok, err, current)
	}
	if devs, err := a.FindReplaced(image); err != nil || !slices.Equal(devs, []string{old}) {
		t.Errorf("FindReplaced with the new image attached = %v, %v; want [%s]", devs, err, old)
	}
	if err := os.Remove(image); err != nil {
		t.Fatal(err)
	}
	if devs, err := a.FindReplaced(image); err != nil || len(devs) != 0 {
		t.Errorf("FindReplaced with no file at the path = %v, %v; want none", devs, err)
	}
}
