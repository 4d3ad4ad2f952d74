package main

import (
	"errors"
	"flag"
	"fmt"
	"path/filepath"

	"github.com/loopvol/loopvol/pkg/registrar"
)

// registrarConfig holds the flags of the registrar controller, with
// node-driver-registrar's names.
type registrarConfig struct {
	kubeletRegistrationPath string
	pluginRegistrationPath  string
	csiNodeMode             string
}

// addFlags declares the registrar controller's flags.
func (c *registrarConfig) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.kubeletRegistrationPath, "kubelet-registration-path", "",
		"Registrar: path of the CSI driver's socket on the host, as kubelet sees it (e.g. /var/lib/kubelet/plugins/loopvol.csi.io/csi.sock); kubelet is told to connect there. Required with the registrar; giving it without --controllers selects the registrar alone, as in a node-driver-registrar manifest.")
	fs.StringVar(&c.pluginRegistrationPath, "plugin-registration-path", "/registration",
		"Registrar: directory that kubelet's plugin watcher watches, as mounted in this container (the host's <kubelet root>/plugins_registry). The registration socket <driver name>-reg.sock is made there; a stale one is replaced, a vanished one made again.")
	fs.StringVar(&c.csiNodeMode, "csinode-mode", string(registrar.ModeKubelet),
		"Registrar: who writes the driver's entry in the node's CSINode. \"kubelet\": kubelet writes it when the registration succeeds; the registrar never writes it and, alone in the process, never talks to the API server (no RBAC). "+
			"\"direct\": there is no kubelet (a bare API server, as in tests); the registrar writes the entry from NodeGetInfo itself, re-reads it on the CSIDriver's nodeAllocatableUpdatePeriodSeconds and after a RESOURCE_EXHAUSTED attach, and needs the ClusterRole loopvol-registrar-direct.")
}

// validate checks the registrar controller's flags; called only when it runs.
func (c *registrarConfig) validate(cfg *config) error {
	switch {
	case c.kubeletRegistrationPath == "":
		return errors.New("the registrar needs --kubelet-registration-path (the driver socket's path on the host, e.g. /var/lib/kubelet/plugins/<driver>/csi.sock)")
	case !filepath.IsAbs(c.kubeletRegistrationPath):
		return fmt.Errorf("--kubelet-registration-path %q must be an absolute path", c.kubeletRegistrationPath)
	case c.pluginRegistrationPath == "" || !filepath.IsAbs(c.pluginRegistrationPath):
		return fmt.Errorf("--plugin-registration-path %q must be an absolute path", c.pluginRegistrationPath)
	}
	switch registrar.Mode(c.csiNodeMode) {
	case registrar.ModeKubelet:
	case registrar.ModeDirect:
		if cfg.nodeName == "" {
			return errors.New("--csinode-mode=direct needs --node-name or $NODE_NAME: the CSINode is named after the node")
		}
	default:
		return fmt.Errorf("--csinode-mode=%q: want %q or %q", c.csiNodeMode, registrar.ModeKubelet, registrar.ModeDirect)
	}
	return nil
}

// needsAPI tells whether the registrar talks to the API server: only in
// direct mode. In kubelet mode it does not, and needs no RBAC.
func (c *registrarConfig) needsAPI() bool {
	return registrar.Mode(c.csiNodeMode) == registrar.ModeDirect
}

// buildRegistrar builds the registrar controller. In kubelet mode it gets
// the API client only when another controller of the process made one (and
// the node name is known): then it checks the CSINode entry kubelet wrote
// for drift, reading only.
func buildRegistrar(d *deps) (*runner, error) {
	c := d.cfg.registrar
	cfg := registrar.Config{
		DriverName:              d.driver,
		KubeletRegistrationPath: c.kubeletRegistrationPath,
		PluginRegistrationPath:  c.pluginRegistrationPath,
		NodeName:                d.cfg.nodeName,
		Mode:                    registrar.Mode(c.csiNodeMode),
		Driver:                  d.csi,
		RetryIntervalStart:      d.cfg.retryIntervalStart,
		RetryIntervalMax:        d.cfg.retryIntervalMax,
		DriftCheckInterval:      d.cfg.resync,
		Registerer:              d.registry,
	}
	if cfg.Mode == registrar.ModeDirect || d.cfg.nodeName != "" {
		cfg.Client = d.client
	}
	if cfg.Mode == registrar.ModeDirect {
		cfg.VolumeAttachments = d.informers.VolumeAttachments()
	}
	r, err := registrar.New(cfg)
	if err != nil {
		return nil, err
	}
	d.health.Add("registrar", r.Healthy)
	return &runner{run: r.Run}, nil
}
