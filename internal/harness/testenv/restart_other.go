//go:build !linux

package testenv

import "errors"

// KillAPIServer is supported on Linux only.
func (e *Env) KillAPIServer() (restart func() error, err error) {
	return nil, errors.New("testenv: KillAPIServer needs Linux")
}

func (e *Env) stopRestarted() error { return nil }
