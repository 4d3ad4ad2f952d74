package main

import (
	"errors"
	"flag"
)

// capacityConfig holds the flags of the capacity controller.
type capacityConfig struct{}

// addFlags declares the capacity controller's flags.
func (c *capacityConfig) addFlags(fs *flag.FlagSet) {}

// validate checks the capacity controller's flags; called only when it runs.
func (c *capacityConfig) validate(cfg *config) error { return nil }

// buildCapacity builds the capacity controller.
func buildCapacity(d *deps) (*runner, error) {
	return nil, errors.New("not implemented yet")
}
