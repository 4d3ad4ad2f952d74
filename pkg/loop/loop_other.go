//go:build !linux

package loop

import (
	"context"
	"errors"
	"os"
)

// On systems without Linux loop devices Devices is a stand-in: every call
// but Owner fails with errors.ErrUnsupported.

var _ Interface = Devices{}

// Attach fails with errors.ErrUnsupported.
func (Devices) Attach(context.Context, string, bool) (string, error) {
	return "", errors.ErrUnsupported
}

// AttachFile fails with errors.ErrUnsupported.
func (Devices) AttachFile(context.Context, *os.File, string, bool) (string, error) {
	return "", errors.ErrUnsupported
}

// Tune fails with errors.ErrUnsupported.
func (Devices) Tune(string, bool) error { return errors.ErrUnsupported }

// Find fails with errors.ErrUnsupported.
func (Devices) Find(string) (string, bool, error) { return "", false, errors.ErrUnsupported }

// FindReplaced fails with errors.ErrUnsupported.
func (Devices) FindReplaced(string) ([]string, error) { return nil, errors.ErrUnsupported }

// List fails with errors.ErrUnsupported.
func (Devices) List() ([]string, error) { return nil, errors.ErrUnsupported }

// Resize fails with errors.ErrUnsupported.
func (Devices) Resize(string) error { return errors.ErrUnsupported }

// Detach fails with errors.ErrUnsupported.
func (Devices) Detach(string) error { return errors.ErrUnsupported }

// Size fails with errors.ErrUnsupported.
func (Devices) Size(string) (int64, error) { return 0, errors.ErrUnsupported }

// Status fails with errors.ErrUnsupported.
func (Devices) Status(string) (Status, error) { return Status{}, errors.ErrUnsupported }
