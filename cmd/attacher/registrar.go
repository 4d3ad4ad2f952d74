package main

import (
	"errors"
	"flag"
)

// registrarConfig holds the flags of the registrar controller.
type registrarConfig struct{}

// addFlags declares the registrar controller's flags.
func (c *registrarConfig) addFlags(fs *flag.FlagSet) {}

// validate checks the registrar controller's flags; called only when it runs.
func (c *registrarConfig) validate(cfg *config) error { return nil }

// buildRegistrar builds the registrar controller.
func buildRegistrar(d *deps) (*runner, error) {
	return nil, errors.New("not implemented yet")
}

// needsAPI tells whether the registrar talks to the API server (it does
// not in kubelet mode, where it needs no RBAC).
func (c *registrarConfig) needsAPI() bool { return false }
