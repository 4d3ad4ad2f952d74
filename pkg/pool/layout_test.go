package pool

import (
	"bytes"
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// allocated returns how many bytes of a volume's image the filesystem has
// allocated.
func allocated(t *testing.T, p *Pool, id VolumeID) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p.ImagePath(id), &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

func TestSetLayout(t *testing.T) {
	p := newTestPool(t)
	const size = 64 << 20
	v, err := p.CreateVolume(t.Context(), spec("pvc-layout", size))
	if err != nil {
		t.Fatal(err)
	}
	id := mustParse(t, v.ID)
	if got := allocated(t, p, id); got < size {
		t.Fatalf("a thick volume has %d of %d bytes allocated", got, size)
	}
	data := bytes.Repeat([]byte("loopvol!"), 1<<17) // 1 MiB
	writeAt(t, p, id, 8<<20, data)
	before, err := p.Usage()
	if err != nil {
		t.Fatal(err)
	}

	// Thick → thin: the unwritten blocks are freed, the data stays, and
	// the freed bytes are still promised to the volume.
	if err := p.SetLayout(t.Context(), v, true, map[string]string{"preallocate": "false"}); err != nil {
		t.Fatal(err)
	}
	if got := allocated(t, p, id); got > 2<<20 {
		t.Errorf("a thin volume with 1 MiB written has %d bytes allocated", got)
	}
	if got := readAt(t, p.ImagePath(id), 8<<20, len(data)); !bytes.Equal(got, data) {
		t.Error("data changed when the volume was made thin")
	}
	after, err := p.Usage()
	if err != nil {
		t.Fatal(err)
	}
	// The pool's filesystem is shared with other processes, so its free
	// bytes move; the promise is the pool's own figure.
	if grown := after.PromisedBytes - before.PromisedBytes; grown < size-2<<20 {
		t.Errorf("the promise grew by %d when %d bytes were freed: a thin volume's promise must still count", grown, size-1<<20)
	}
	got, err := p.ReadVolume(id)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Thin || got.Modifying != nil {
		t.Fatalf("record after thinning: thin %v, modifying %v", got.Thin, got.Modifying)
	}
	gen := got.Generation
	// The same layout again writes nothing.
	if err := p.SetLayout(t.Context(), got, true, map[string]string{"preallocate": "false"}); err != nil || got.Generation != gen {
		t.Fatalf("repeated SetLayout: %v, generation %d → %d", err, gen, got.Generation)
	}

	// Thin → thick, also while attached.
	got.Attachments = []Attachment{{Node: "n1"}}
	if err := p.WriteVolume(got); err != nil {
		t.Fatal(err)
	}
	if err := p.SetLayout(t.Context(), got, false, map[string]string{"preallocate": "true"}); err != nil {
		t.Fatal(err)
	}
	if a := allocated(t, p, id); a < size {
		t.Errorf("a thickened volume has %d of %d bytes allocated", a, size)
	}
	if b := readAt(t, p.ImagePath(id), 8<<20, len(data)); !bytes.Equal(b, data) {
		t.Error("data changed when the volume was made thick")
	}
	// Thinning an attached volume is refused, and nothing changes.
	gen = got.Generation
	if err := p.SetLayout(t.Context(), got, true, nil); !errors.Is(err, ErrInUse) {
		t.Fatalf("thinning an attached volume = %v, want ErrInUse", err)
	}
	if got.Generation != gen || allocated(t, p, id) < size {
		t.Error("a refused thinning changed the record or the image")
	}
}

// A modify that crashed after writing its intent is finished by the retry.
func TestSetLayoutFinishesAfterCrash(t *testing.T) {
	p := newTestPool(t)
	const size = 16 << 20
	v, err := p.CreateVolume(t.Context(), spec("pvc-crash", size))
	if err != nil {
		t.Fatal(err)
	}
	id := mustParse(t, v.ID)
	// What a crash between the intent and the image change leaves.
	v.Modifying = map[string]string{"preallocate": "false"}
	if err := p.WriteVolume(v); err != nil {
		t.Fatal(err)
	}
	v, err = p.ReadVolume(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.SetLayout(t.Context(), v, true, map[string]string{"preallocate": "false"}); err != nil {
		t.Fatal(err)
	}
	v, err = p.ReadVolume(id)
	if err != nil {
		t.Fatal(err)
	}
	if !v.Thin || v.Modifying != nil || allocated(t, p, id) > 1<<20 {
		t.Fatalf("after the retry: thin %v, modifying %v, %d bytes allocated", v.Thin, v.Modifying, allocated(t, p, id))
	}
	// A crash half-way back to thick: the record still says thin with the
	// intent; the retry allocates the rest.
	v.Modifying = map[string]string{"preallocate": "true"}
	if err := p.WriteVolume(v); err != nil {
		t.Fatal(err)
	}
	if err := p.SetLayout(t.Context(), v, false, map[string]string{"preallocate": "true"}); err != nil {
		t.Fatal(err)
	}
	if v.Thin || v.Modifying != nil || allocated(t, p, id) < size {
		t.Fatalf("after the second retry: thin %v, modifying %v, %d bytes allocated", v.Thin, v.Modifying, allocated(t, p, id))
	}
}

func TestCreateThinVolume(t *testing.T) {
	p := newTestPool(t)
	s := spec("pvc-thin", 32<<20)
	s.Thin = true
	v, err := p.CreateVolume(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	id := mustParse(t, v.ID)
	if a := allocated(t, p, id); a != 0 || !v.Thin {
		t.Fatalf("a new thin volume: %d bytes allocated, record thin %v", a, v.Thin)
	}
	u, err := p.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if u.PromisedBytes < 32<<20 {
		t.Errorf("promised %d: a thin volume's size must be promised", u.PromisedBytes)
	}
	// A thin clone of it stays thin; a thick one is allocated whole.
	for _, thin := range []bool{true, false} {
		c := spec("pvc-thin-clone-"+map[bool]string{true: "thin", false: "thick"}[thin], 48<<20)
		c.Thin = thin
		c.Source = &Source{ID: v.ID, SizeBytes: v.SizeBytes}
		cv, err := p.CreateVolume(t.Context(), c)
		if err != nil {
			t.Fatal(err)
		}
		a := allocated(t, p, mustParse(t, cv.ID))
		if thin && a != 0 || !thin && a < 48<<20 {
			t.Errorf("clone thin=%v: %d bytes allocated", thin, a)
		}
	}
}
