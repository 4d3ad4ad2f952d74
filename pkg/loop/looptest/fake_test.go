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
