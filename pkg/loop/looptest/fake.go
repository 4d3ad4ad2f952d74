// Package looptest provides a fake loop.Interface for unit tests that must
// not need root or touch real devices.
package looptest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/loopvol/loopvol/pkg/loop"
)

// Fake keeps "attached devices" in memory. Device sizes follow the size of
// the image file on disk when the image exists (as of Attach or the last
// Resize), so expansion can be tested with real, sparse files.
type Fake struct {
	mu      sync.Mutex
	devices map[string]*device // devPath → device
	// NoDirectIO makes Attach fall back to buffered I/O, as on a backing
	// filesystem that refuses direct I/O.
	NoDirectIO bool
	// Err, when set, is returned by every method before it does anything.
	Err error
	// TuneErr, when set, is returned by Tune (a read-only /sys).
	TuneErr error
	// Calls lists the calls made, in order, as "Attach /pool/x.img" and the like.
	Calls []string
}

type device struct {
	image    string
	readOnly bool
	directIO bool
	size     int64
	tuned    bool
	discard  bool
}

var _ loop.Interface = (*Fake)(nil)

// New returns a fake with no devices attached.
func New() *Fake { return &Fake{devices: map[string]*device{}} }

func (f *Fake) call(format string, args ...any) error {
	f.Calls = append(f.Calls, fmt.Sprintf(format, args...))
	return f.Err
}

// Attach implements loop.Interface.
func (f *Fake) Attach(ctx context.Context, imagePath string, readOnly bool) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Attach %s", imagePath); err != nil {
		return "", err
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	st, err := os.Stat(imagePath)
	if err != nil {
		return "", fmt.Errorf("open image: %w", err)
	}
	// Like the kernel, hand out the lowest free device number.
	var devPath string
	for n := 0; ; n++ {
		devPath = fmt.Sprintf("/dev/loop%d", n)
		if _, used := f.devices[devPath]; !used {
			break
		}
	}
	f.devices[devPath] = &device{image: filepath.Clean(imagePath), readOnly: readOnly, directIO: !f.NoDirectIO, size: st.Size()}
	return devPath, nil
}

// AttachFile implements loop.Interface: the fake attaches the file's name.
func (f *Fake) AttachFile(ctx context.Context, image *os.File, imagePath string, readOnly bool) (string, error) {
	if _, err := image.Stat(); err != nil {
		return "", fmt.Errorf("image %s: %w", imagePath, err)
	}
	return f.Attach(ctx, imagePath, readOnly)
}

// Find implements loop.Interface.
func (f *Fake) Find(imagePath string) (string, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Find %s", imagePath); err != nil {
		return "", false, err
	}
	paths := make([]string, 0, len(f.devices))
	for p := range f.devices {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		if f.devices[p].image == filepath.Clean(imagePath) {
			return p, true, nil
		}
	}
	return "", false, nil
}

// Resize implements loop.Interface.
func (f *Fake) Resize(devPath string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Resize %s", devPath); err != nil {
		return err
	}
	d, ok := f.devices[devPath]
	if !ok {
		return fmt.Errorf("%s: %w", devPath, loop.ErrNotAttached)
	}
	st, err := os.Stat(d.image)
	if err != nil {
		return err
	}
	d.size = st.Size()
	return nil
}

// Detach implements loop.Interface.
func (f *Fake) Detach(devPath string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Detach %s", devPath); err != nil {
		return err
	}
	delete(f.devices, devPath)
	return nil
}

// Size implements loop.Interface.
func (f *Fake) Size(devPath string) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Size %s", devPath); err != nil {
		return 0, err
	}
	d, ok := f.devices[devPath]
	if !ok {
		return 0, fmt.Errorf("%s: %w", devPath, loop.ErrNotAttached)
	}
	return d.size, nil
}

// Status implements loop.Interface.
func (f *Fake) Status(devPath string) (loop.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Status %s", devPath); err != nil {
		return loop.Status{}, err
	}
	d, ok := f.devices[devPath]
	if !ok {
		return loop.Status{}, fmt.Errorf("%s: %w", devPath, loop.ErrNotAttached)
	}
	_, err := os.Stat(d.image)
	return loop.Status{
		BackingFile: d.image,
		Deleted:     errors.Is(err, os.ErrNotExist),
		DirectIO:    d.directIO,
		ReadOnly:    d.readOnly,
	}, nil
}

// Tune implements loop.Interface: the fake records that the device was
// tuned (Tuned) and whether it passes discards (Discards).
func (f *Fake) Tune(devPath string, discard bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Tune %s", devPath); err != nil {
		return err
	}
	if f.TuneErr != nil {
		return f.TuneErr
	}
	d, ok := f.devices[devPath]
	if !ok {
		return fmt.Errorf("%s: %w", devPath, loop.ErrNotAttached)
	}
	d.tuned = true
	d.discard = discard
	return nil
}

// Discards reports whether the attached device was last tuned to pass
// discards (a thin volume's).
func (f *Fake) Discards(devPath string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.devices[devPath]
	return ok && d.tuned && d.discard
}

// Tuned reports whether the attached device was tuned.
func (f *Fake) Tuned(devPath string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.devices[devPath]
	return ok && d.tuned
}

// Attached returns the attached devices as devPath → image path.
func (f *Fake) Attached() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := make(map[string]string, len(f.devices))
	for p, d := range f.devices {
		m[p] = d.image
	}
	return m
}
