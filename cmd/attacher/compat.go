package main

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/component-base/featuregate"
)

// compatFlags are flags of the upstream sidecars that a manifest written for
// them may pass. They are accepted, so switching a manifest to this sidecar
// is a change of image and nothing else, and each does what upstream does
// with it or, where that does not apply here, is ignored with a reason in
// its help text.
type compatFlags struct {
	leaderElectionLabels labelMap
	metricsAddress       string
	featureGates         featureGates
	automaxprocs         bool
	healthPort           int
	mode                 string
	connectionTimeout    time.Duration
	master               string
	enableCapacity       bool
}

// node-driver-registrar's --mode values: registrationMode is its default,
// registrationProbeMode its deprecated liveness probe, after which the
// process exits 0 at once.
const (
	registrationMode      = "registration"
	registrationProbeMode = "kubelet-registration-probe"
)

func (c *compatFlags) addFlags(fs *flag.FlagSet) {
	c.leaderElectionLabels = labelMap{}
	fs.Var(&c.leaderElectionLabels, "leader-election-labels", "Labels to put on the leader-election Leases, as key:value pairs separated by commas (upstream's format), e.g. 'team:storage,tier:infra'.")
	fs.StringVar(&c.metricsAddress, "metrics-address", "", "Deprecated (as upstream): host:port to serve the metrics on; use --http-endpoint, which also serves /healthz. Only one of the two may be set.")
	c.featureGates = newFeatureGates()
	fs.Var(&c.featureGates, "feature-gates", "Upstream feature gates, as key=bool pairs separated by commas: "+c.featureGates.known()+
		". Each is accepted so upstream manifests run; what they switch is always on here (the Lease is always released on exit; errorCode is always written), except AnnotateFsResize and VolumeAttributesClass, which the resizer honours as upstream (both on by default; VolumeAttributesClass=false turns the modify controller off).")
	fs.BoolVar(&c.automaxprocs, "automaxprocs", false, "Accepted for upstream manifests and ignored: since Go 1.25 the runtime sets GOMAXPROCS from the container's CPU limit by itself.")
	fs.IntVar(&c.healthPort, "health-port", 0, "Deprecated (node-driver-registrar): TCP port of /healthz on all addresses; use --http-endpoint. 0 disables it; only one of the two may be set.")
	fs.StringVar(&c.mode, "mode", "", "Deprecated (node-driver-registrar): \""+registrationProbeMode+"\" makes the process exit 0 at once, as upstream's probe mode ended up doing; \""+registrationMode+"\" (upstream's default) changes nothing; no other value is accepted.")
	fs.DurationVar(&c.connectionTimeout, "connection-timeout", 0, "Ignored, as upstream ignores it: the sidecar waits for the CSI driver as long as it takes.")
	fs.StringVar(&c.master, "master", "", "URL of the API server, overriding the kubeconfig's (external-provisioner and external-resizer have it). Empty: the kubeconfig's, or the in-cluster one.")
	fs.BoolVar(&c.enableCapacity, "enable-capacity", false, "external-provisioner's switch of its capacity controller: here it adds capacity to --controllers.")
}

// registrationProbe tells whether --mode asked for the registrar's probe.
func (c *compatFlags) registrationProbe() bool { return c.mode == registrationProbeMode }

// apply folds the deprecated aliases into cfg; set holds the flags given.
func (c *compatFlags) apply(cfg *config, set map[string]bool) error {
	if c.mode != "" && c.mode != registrationMode && c.mode != registrationProbeMode {
		return fmt.Errorf("--mode=%q: only %q and %q are accepted (and deprecated); choose controllers with --controllers", c.mode, registrationMode, registrationProbeMode)
	}
	if c.enableCapacity && !cfg.runs(controllerCapacity) {
		cfg.controllers = append(cfg.controllers, controllerCapacity)
	}
	aliases := 0
	for _, name := range []string{"http-endpoint", "metrics-address", "health-port"} {
		if set[name] && (name != "health-port" || c.healthPort != 0) {
			aliases++
		}
	}
	if aliases > 1 {
		return errors.New("only one of --http-endpoint, --metrics-address and --health-port may be set")
	}
	switch {
	case c.metricsAddress != "":
		cfg.httpEndpoint = c.metricsAddress
	case c.healthPort < 0 || c.healthPort > 65535:
		return fmt.Errorf("--health-port=%d is not a port", c.healthPort)
	case c.healthPort != 0:
		cfg.httpEndpoint = fmt.Sprintf(":%d", c.healthPort)
	}
	return nil
}

// labelMap is a flag of key:value pairs separated by commas.
type labelMap map[string]string

func (m labelMap) String() string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+":"+m[k])
	}
	return strings.Join(parts, ",")
}

func (m labelMap) Set(value string) error {
	for item := range strings.SplitSeq(value, ",") {
		k, v, ok := strings.Cut(item, ":")
		if !ok || k == "" || strings.Contains(v, ":") {
			return fmt.Errorf("label %q is not key:value", item)
		}
		m[k] = v
	}
	return nil
}

// featureGates holds the gates of the upstream sidecars. Every one is
// known, so that a manifest setting any of them parses; an unknown name is
// an error, as upstream.
type featureGates struct {
	fg featuregate.MutableFeatureGate
}

func newFeatureGates() featureGates {
	fg := featuregate.NewFeatureGate()
	beta, ga, alpha := featuregate.FeatureSpec{Default: true, PreRelease: featuregate.Beta},
		featuregate.FeatureSpec{Default: true, PreRelease: featuregate.GA},
		featuregate.FeatureSpec{Default: false, PreRelease: featuregate.Alpha}
	// external-attacher, external-provisioner, external-resizer and
	// node-driver-registrar as of their releases for Kubernetes 1.37.
	err := fg.Add(map[featuregate.Feature]featuregate.FeatureSpec{
		"ReleaseLeaderElectionOnExit":    alpha,
		"MutableCSINodeAllocatableCount": ga,
		"Topology":                       ga,
		"CrossNamespaceVolumeDataSource": alpha,
		"VolumeAttributesClass":          ga,
		"RecoverVolumeExpansionFailure":  ga,
		"AnnotateFsResize":               beta,
	})
	if err != nil {
		panic(err) // a fixed table: fails only if it is wrong
	}
	return featureGates{fg: fg}
}

func (g *featureGates) String() string { return "" }

func (g *featureGates) Set(value string) error {
	m := map[string]bool{}
	for item := range strings.SplitSeq(value, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok {
			return fmt.Errorf("feature gate %q is not name=true|false", item)
		}
		switch v {
		case "true":
			m[k] = true
		case "false":
			m[k] = false
		default:
			return fmt.Errorf("feature gate %q: %q is not true or false", k, v)
		}
	}
	return g.fg.SetFromMap(m)
}

func (g *featureGates) known() string {
	var names []string
	for name := range g.fg.GetAll() {
		names = append(names, string(name))
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}
