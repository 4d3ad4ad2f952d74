//go:build !linux

package testenv

// watchdog needs PR_SET_PDEATHSIG, which only Linux has; elsewhere the
// control plane is stopped by Stop alone.
type watchdog struct{}

func startWatchdog(exes, dirs []string) *watchdog { return nil }

func (w *watchdog) stop() {}
