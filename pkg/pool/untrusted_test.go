package pool

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// hostFile is a file outside the pool that a hostile pool entry points at;
// the tests check that it is never read, written or removed.
func hostFile(t *testing.T) (string, []byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "host-secret")
	data := []byte(`{"id": "not yours"}`)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, data
}

func volPath(p *Pool, name string) string { return filepath.Join(p.Path, volumesDir, name) }

// TestUntrustedRecords: every kind of entry that is not a record loopvol
// wrote is reported as ErrCorrupt at once, without following, blocking on or
// reading it whole, and the volumes next to it still read.
func TestUntrustedRecords(t *testing.T) {
	host, hostData := hostFile(t)
	tests := []struct {
		name    string
		plant   func(t *testing.T, path string)
		message string
	}{
		{name: "symlink to a host file", plant: func(t *testing.T, path string) { must(t, os.Symlink(host, path)) }, message: "a symlink"},
		{name: "FIFO", plant: func(t *testing.T, path string) { must(t, syscall.Mkfifo(path, 0o600)) }, message: "a FIFO"},
		{name: "directory", plant: func(t *testing.T, path string) { must(t, os.Mkdir(path, 0o700)) }, message: "a directory"},
		{name: "hard link", plant: func(t *testing.T, path string) {
			other := filepath.Join(filepath.Dir(path), "elsewhere")
			must(t, os.WriteFile(other, []byte("{}"), 0o600))
			must(t, os.Link(other, path))
		}, message: "hard links"},
		{name: "oversized", plant: func(t *testing.T, path string) {
			f, err := os.Create(path)
			must(t, err)
			// Sparse: 1 GiB of size, no blocks. Reading it whole would take
			// a GiB of memory.
			must(t, f.Truncate(1<<30))
			f.Close()
		}, message: "more than the"},
		{name: "other owner", plant: func(t *testing.T, path string) {
			must(t, os.WriteFile(path, []byte("{}"), 0o600))
			if err := os.Chown(path, 12345, 12345); err != nil {
				t.Skipf("cannot chown (not root): %v", err)
			}
		}, message: "owned by uid 12345"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPool(t)
			good, err := p.CreateVolume(t.Context(), spec("good", 1<<20))
			must(t, err)
			id := DeriveVolumeID(p.Name, "bad")
			tc.plant(t, volPath(p, recordName(id)))

			done := make(chan error, 1)
			go func() { _, err := p.ReadVolume(id); done <- err }()
			select {
			case err = <-done:
			case <-time.After(time.Minute):
				t.Fatal("ReadVolume blocked on the entry")
			}
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tc.message) {
				t.Fatalf("ReadVolume = %v, want ErrCorrupt saying %q", err, tc.message)
			}
			if _, err := p.ReadVolume(mustParse(t, good.ID)); err != nil {
				t.Fatalf("the good volume next to it: %v", err)
			}
			ids, err := p.ListVolumeIDs()
			if err != nil || len(ids) != 2 {
				t.Fatalf("ListVolumeIDs = %v, %v; want both entries", ids, err)
			}
			if n, err := p.CountAttachments("n1"); err != nil || n != 0 {
				t.Fatalf("CountAttachments = %d, %v", n, err)
			}
			if got, _ := os.ReadFile(host); string(got) != string(hostData) {
				t.Fatalf("host file changed: %q", got)
			}
		})
	}
}

// TestUntrustedImages: an image replaced by a symlink, a FIFO, a device-like
// entry or a hard link is refused by every image operation; deleting the
// volume unlinks the entry and leaves its target alone.
func TestUntrustedImages(t *testing.T) {
	host, hostData := hostFile(t)
	tests := []struct {
		name  string
		plant func(t *testing.T, path string)
	}{
		{name: "symlink to a host file", plant: func(t *testing.T, path string) { must(t, os.Symlink(host, path)) }},
		{name: "FIFO", plant: func(t *testing.T, path string) { must(t, syscall.Mkfifo(path, 0o600)) }},
		{name: "directory", plant: func(t *testing.T, path string) { must(t, os.Mkdir(path, 0o700)) }},
		{name: "hard link to a host file", plant: func(t *testing.T, path string) {
			if err := os.Link(host, path); err != nil {
				t.Skipf("cannot hard-link across filesystems: %v", err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPool(t)
			v, err := p.CreateVolume(t.Context(), spec("v", 1<<20))
			must(t, err)
			id := mustParse(t, v.ID)
			must(t, os.Remove(volPath(p, imageName(id))))
			tc.plant(t, volPath(p, imageName(id)))

			if _, err := p.ImageSize(id); !errors.Is(err, ErrUntrusted) {
				t.Errorf("ImageSize = %v, want ErrUntrusted", err)
			}
			if f, err := p.OpenImage(id, os.O_RDWR); !errors.Is(err, ErrUntrusted) {
				if f != nil {
					f.Close()
				}
				t.Errorf("OpenImage = %v, want ErrUntrusted", err)
			}
			if err := p.ExpandVolume(t.Context(), v, 2<<20); !errors.Is(err, ErrUntrusted) {
				t.Errorf("ExpandVolume = %v, want ErrUntrusted", err)
			}
			if _, err := p.Usage(); err != nil {
				t.Errorf("Usage: %v", err)
			}
			if os.Remove(volPath(p, recordName(id))) == nil {
				if _, err := p.Sweep(time.Now().Add(24*time.Hour), time.Minute); err != nil {
					t.Errorf("Sweep: %v", err)
				}
			}
			if tc.name != "directory" {
				must(t, p.DeleteVolume(id))
			}
			if got, err := os.ReadFile(host); err != nil || string(got) != string(hostData) {
				t.Fatalf("host file after the image operations: %q, %v", got, err)
			}
		})
	}
}

// TestSwappedDirectories: a symlink in place of volumes/ is refused at Open;
// one swapped in after Open is never followed (the pool keeps working on the
// directory it opened) and makes Check fail.
func TestSwappedDirectories(t *testing.T) {
	elsewhere := t.TempDir()
	root := filepath.Join(t.TempDir(), "pool")
	must(t, os.MkdirAll(root, 0o750))
	must(t, os.Symlink(elsewhere, filepath.Join(root, volumesDir)))
	if _, err := Open(Options{Name: "test", Zone: "z", Path: root}); err == nil {
		t.Fatal("Open accepted a symlink as volumes/")
	}
	must(t, os.Remove(filepath.Join(root, volumesDir)))

	p, err := Open(Options{Name: "test", Zone: "z", Path: root})
	must(t, err)
	must(t, os.Rename(filepath.Join(root, volumesDir), filepath.Join(root, "moved")))
	must(t, os.Symlink(elsewhere, filepath.Join(root, volumesDir)))
	if _, err := p.CreateVolume(t.Context(), spec("v", 1<<20)); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(elsewhere); len(entries) != 0 {
		t.Fatalf("the pool wrote through the swapped-in symlink: %v", entries)
	}
	if err := p.Check(); !errors.Is(err, ErrUntrusted) {
		t.Fatalf("Check after the swap = %v, want ErrUntrusted", err)
	}
}

// TestRecordSizeLimit: a record that would exceed MaxRecordBytes is not
// written (so no reader refuses what a writer made), and the old one stays.
func TestRecordSizeLimit(t *testing.T) {
	p := newTestPool(t)
	v, err := p.CreateVolume(t.Context(), spec("v", 1<<20))
	must(t, err)
	for i := 0; i < MaxRecordBytes/64; i++ {
		v.Attachments = append(v.Attachments, Attachment{Node: strings.Repeat("n", 60)})
	}
	if err := p.WriteVolume(v); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("WriteVolume of a huge record = %v, want ErrTooLarge", err)
	}
	got, err := p.ReadVolume(mustParse(t, v.ID))
	if err != nil || len(got.Attachments) != 0 || got.Generation != 1 {
		t.Fatalf("record after the refused write: %+v, %v", got, err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func mustParse(t *testing.T, s string) VolumeID {
	t.Helper()
	id, err := ParseVolumeID(s)
	must(t, err)
	return id
}
