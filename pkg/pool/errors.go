package pool

import "errors"

// Sentinel errors; callers test them with errors.Is and map them to gRPC codes
// in one place.
var (
	// ErrInvalidID: a volume ID, pool name or node ID that does not parse.
	ErrInvalidID = errors.New("invalid identifier")
	// ErrNotFound: the volume, node or pool does not exist.
	ErrNotFound = errors.New("not found")
	// ErrExists: a volume with this name exists with incompatible properties.
	ErrExists = errors.New("already exists with different properties")
	// ErrCorrupt: a record exists but cannot be read (for example half-written).
	ErrCorrupt = errors.New("record is corrupt")
	// ErrNoSpace: the pool cannot hold the requested size.
	ErrNoSpace = errors.New("not enough space in pool")
	// ErrInUse: the volume is still attached somewhere.
	ErrInUse = errors.New("volume is in use")
	// ErrBusy: another operation holds the volume's lock.
	ErrBusy = errors.New("an operation on this volume is in progress")
	// ErrPoolMismatch: the directory is marked as a different pool.
	ErrPoolMismatch = errors.New("directory belongs to another pool")
	// ErrUntrusted: a pool file is not what loopvol makes (a symlink, FIFO,
	// directory, device or hard link in place of a record or image, or a
	// file of another owner); it is never followed or opened for I/O.
	ErrUntrusted = errors.New("pool file cannot be trusted")
	// ErrMoved: the record read is a forwarding record: the volume lives
	// in another pool (Locate follows it).
	ErrMoved = errors.New("volume moved to another pool")
	// ErrGuest: the record under this pool's ID is of another pool's
	// volume that was moved here (same hash): no volume of this ID.
	ErrGuest = errors.New("record is of a volume moved here from another pool")
	// ErrUnwritable: the pool's filesystem refuses to create a file (it is
	// full, over quota, read-only or failing), so the pool can take no new
	// volume, snapshot or lock file until that is mended. What exists in it
	// can still be read.
	ErrUnwritable = errors.New("pool filesystem refuses writes")
	// ErrNeedsCopy: the pool's filesystem has no reflink, so what was asked
	// (a fence that must not copy: FenceImageByReflink) would need a full
	// copy of the image.
	ErrNeedsCopy = errors.New("the pool's filesystem has no reflink: it would take a full copy")
	// ErrWrittenDuringFence: a fence by full copy saw the image written
	// while it copied it, so the copy is no consistent image and was
	// thrown away: the node it fences writes again (it came back).
	ErrWrittenDuringFence = errors.New("the image was written while the fence copied it")
	// ErrTooLarge: a record would exceed MaxRecordBytes.
	ErrTooLarge = errors.New("record too large")
)
