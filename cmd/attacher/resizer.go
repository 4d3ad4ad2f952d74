package main

import (
	"errors"
	"flag"
)

// resizerConfig holds the flags of the resizer controller.
type resizerConfig struct{}

// addFlags declares the resizer controller's flags.
func (c *resizerConfig) addFlags(fs *flag.FlagSet) {}

// validate checks the resizer controller's flags; called only when it runs.
func (c *resizerConfig) validate(cfg *config) error { return nil }

// buildResizer builds the resizer controller.
func buildResizer(d *deps) (*runner, error) {
	return nil, errors.New("not implemented yet")
}
