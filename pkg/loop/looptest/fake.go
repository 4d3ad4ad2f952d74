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
	"syscall"

	"github.com/loopvol/loopvol/pkg/loop"
)

// Fake keeps "attached devices" in memory. Device sizes follow the size of
// the image file on disk when the image exists (as of Attach or the last
// Resize), so expansion can be tested with real, sparse files. A device
// remembers the device and inode of the file it was attached to, so a real
// file renamed over the image (a fence, pkg/pool FenceImage) replaces it as
// it would on a kernel: Find passes over the device, FindReplaced returns
// it, and Status says it is deleted.
//
// A Fake acts for an owner, as loop.Devices does (loop.Interface): its
// devices are tagged with the owner, Find and List pass over other owners'
// devices, and the other methods refuse them with loop.ErrNotOwned. Peer
// gives another owner's view of the same devices: two node plugins on one
// kernel.
type Fake struct {
	*machine
	owner string
	// NoDirectIO makes Attach fall back to buffered I/O, as on a backing
	// filesystem that refuses direct I/O.
	NoDirectIO bool
	// Err, when set, is returned by every method before it does anything.
	Err error
	// TuneErr, when set, is returned by Tune (a read-only /sys).
	TuneErr error
	// Calls lists the calls made through this Fake (not its peers), in
	// order, as "Attach /pool/x.img" and the like.
	Calls []string
	// OnCall, when set, is called with each call as Calls records it,
	// before the call does anything (with the Fake's lock held: it must
	// not call the Fake): a test makes something happen between two
	// steps of the code under test with it.
	OnCall func(call string)
}

// machine is the devices the peers of a Fake share, the kernel's.
type machine struct {
	mu      sync.Mutex
	devices map[string]*device // devPath → device
}

type device struct {
	image    string
	owner    string // "": untagged, as an older loopvol attached it
	readOnly bool
	directIO bool
	size     int64
	file     fileID // of the file attached, as Attach found it
	tuned    bool
	discard  bool
}

// fileID is a file's device and inode: what tells a replaced image from
// the file now at its path.
type fileID struct{ dev, ino uint64 }

func idOf(fi os.FileInfo) fileID {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}
	}
	return fileID{dev: uint64(st.Dev), ino: uint64(st.Ino)}
}

// replaced tells whether another file than d's is now at d's image path;
// false when none is (the image was deleted).
func (d *device) replaced() bool {
	fi, err := os.Stat(d.image)
	return err == nil && idOf(fi) != d.file
}

var _ loop.Interface = (*Fake)(nil)

// New returns a fake acting for owner (a node ID; "" for none: it sees
// every device and attaches untagged ones) with no devices attached.
func New(owner string) *Fake {
	return &Fake{machine: &machine{devices: map[string]*device{}}, owner: owner}
}

// Peer returns a fake acting for owner on f's devices: another node's
// plugin on the same kernel, or with owner "" the machine's view (which
// attaches untagged devices, as an older loopvol did). It has its own
// Calls, Err and settings.
func (f *Fake) Peer(owner string) *Fake { return &Fake{machine: f.machine, owner: owner} }

// Owner implements loop.Interface.
func (f *Fake) Owner() string { return f.owner }

func (f *Fake) call(format string, args ...any) error {
	c := fmt.Sprintf(format, args...)
	f.Calls = append(f.Calls, c)
	if f.OnCall != nil {
		f.OnCall(c)
	}
	return f.Err
}

// visible tells whether f sees d: its own, untagged, or f has no owner.
func (f *Fake) visible(d *device) bool {
	return f.owner == "" || d.owner == "" || d.owner == f.owner
}

// held returns f's attached device devPath: loop.ErrNotAttached when there
// is none, loop.ErrNotOwned when another owner's.
func (f *Fake) held(devPath string) (*device, error) {
	d, ok := f.devices[devPath]
	if !ok {
		return nil, fmt.Errorf("%s: %w", devPath, loop.ErrNotAttached)
	}
	if !f.visible(d) {
		return nil, fmt.Errorf("%s: %w (%s's)", devPath, loop.ErrNotOwned, d.owner)
	}
	return d, nil
}

// sortedPaths returns the device paths in the order of their numbers.
func (m *machine) sortedPaths() []string {
	paths := make([]string, 0, len(m.devices))
	for p := range m.devices {
		paths = append(paths, p)
	}
	sort.Slice(paths, func(i, j int) bool {
		if len(paths[i]) != len(paths[j]) {
			return len(paths[i]) < len(paths[j])
		}
		return paths[i] < paths[j]
	})
	return paths
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
	return f.attach(imagePath, st, readOnly), nil
}

// attach puts the image whose file is st on the lowest free device.
func (f *Fake) attach(imagePath string, st os.FileInfo, readOnly bool) string {
	// Like the kernel, hand out the lowest free device number.
	var devPath string
	for n := 0; ; n++ {
		devPath = fmt.Sprintf("/dev/loop%d", n)
		if _, used := f.devices[devPath]; !used {
			break
		}
	}
	f.devices[devPath] = &device{image: filepath.Clean(imagePath), owner: f.owner, readOnly: readOnly, directIO: !f.NoDirectIO,
		size: st.Size(), file: idOf(st)}
	return devPath
}

// AttachFile implements loop.Interface: the fake attaches the file's name,
// and remembers the file itself, as the kernel holds it.
func (f *Fake) AttachFile(ctx context.Context, image *os.File, imagePath string, readOnly bool) (string, error) {
	st, err := image.Stat()
	if err != nil {
		return "", fmt.Errorf("image %s: %w", imagePath, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Attach %s", imagePath); err != nil {
		return "", err
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	return f.attach(imagePath, st, readOnly), nil
}

// Find implements loop.Interface: f's own device of the image, else an
// untagged one; never a device of a file that another replaced at the path.
func (f *Fake) Find(imagePath string) (string, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Find %s", imagePath); err != nil {
		return "", false, err
	}
	untagged := ""
	for _, p := range f.sortedPaths() {
		d := f.devices[p]
		if d.image != filepath.Clean(imagePath) || !f.visible(d) || d.replaced() {
			continue
		}
		if d.owner == f.owner {
			return p, true, nil
		}
		if untagged == "" {
			untagged = p
		}
	}
	return untagged, untagged != "", nil
}

// FindReplaced implements loop.Interface: f's own devices (every device
// without an owner) of a file that another replaced at the path.
func (f *Fake) FindReplaced(imagePath string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("FindReplaced %s", imagePath); err != nil {
		return nil, err
	}
	var devs []string
	for _, p := range f.sortedPaths() {
		d := f.devices[p]
		if d.image == filepath.Clean(imagePath) && (f.owner == "" || d.owner == f.owner) && d.replaced() {
			devs = append(devs, p)
		}
	}
	return devs, nil
}

// List implements loop.Interface.
func (f *Fake) List() ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("List"); err != nil {
		return nil, err
	}
	var devs []string
	for _, p := range f.sortedPaths() {
		if f.visible(f.devices[p]) {
			devs = append(devs, p)
		}
	}
	return devs, nil
}

// Resize implements loop.Interface.
func (f *Fake) Resize(devPath string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Resize %s", devPath); err != nil {
		return err
	}
	d, err := f.held(devPath)
	if err != nil {
		return err
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
	if _, err := f.held(devPath); errors.Is(err, loop.ErrNotOwned) {
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
	d, err := f.held(devPath)
	if err != nil {
		return 0, err
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
	d, err := f.held(devPath)
	if err != nil {
		return loop.Status{}, err
	}
	_, err = os.Stat(d.image)
	return loop.Status{
		OwnerTag:    loop.OwnerTag(d.owner),
		BackingFile: d.image,
		Deleted:     errors.Is(err, os.ErrNotExist) || d.replaced(),
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
	d, err := f.held(devPath)
	if err != nil {
		return err
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

// OwnerOf returns the owner of the attached device devPath ("" for an
// untagged one), whoever f acts for; ok is false when nothing is attached
// there.
func (f *Fake) OwnerOf(devPath string) (owner string, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.devices[devPath]
	if !ok {
		return "", false
	}
	return d.owner, true
}

// Attached returns every attached device, whoever f acts for, as devPath →
// image path.
func (f *Fake) Attached() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := make(map[string]string, len(f.devices))
	for p, d := range f.devices {
		m[p] = d.image
	}
	return m
}
