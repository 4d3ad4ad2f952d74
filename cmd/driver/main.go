// Command driver is the loopvol CSI driver: the Identity service plus the
// Controller service (--mode=controller), the Node service (--mode=node) or
// both (--mode=all) on one unix socket. `driver status` prints the status of
// a running node plugin (status.go).
//
// main only parses the flags into a config, validates it and calls run,
// and exits in one place; run opens the pools, builds the services, serves
// them with the metrics and health endpoint, and returns when they stop.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/internal/command"
	"github.com/loopvol/loopvol/pkg/csiserver"
	"github.com/loopvol/loopvol/pkg/heartbeat"
	"github.com/loopvol/loopvol/pkg/node"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// The modes of --mode.
const (
	modeController = "controller"
	modeNode       = "node"
	modeAll        = "all"
)

// config holds every flag.
type config struct {
	endpoint      string
	mode          string
	driverName    string
	nodeID        string
	zone          string
	pools         poolFlag
	configFile    string
	kubeletDir    string
	podUID        string
	maxVolumes    int64
	httpEndpoint  string
	defaultFsType string
	showVersion   bool

	// The heartbeat (node mode; heartbeat.go).
	heartbeatNamespace string
	kubeconfig         string
	heartbeatInterval  time.Duration
	fencingPeriod      time.Duration
	selfFenceAfter     time.Duration

	logging *logsapi.LoggingConfiguration
}

// poolFlag collects repeated --pool NAME=PATH flags.
type poolFlag []pool.Options

func (p *poolFlag) String() string { return fmt.Sprint(*p) }

func (p *poolFlag) Set(v string) error {
	name, path, ok := strings.Cut(v, "=")
	if !ok || name == "" || path == "" {
		return fmt.Errorf("want NAME=PATH, got %q", v)
	}
	*p = append(*p, pool.Options{Name: name, Path: path})
	return nil
}

func main() {
	os.Exit(mainWithCode(os.Args[1:], os.Stdout, os.Stderr))
}

// mainWithCode runs the command and returns its exit code: 0 after a clean
// stop, 1 when it failed, 2 for a bad command line.
func mainWithCode(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "status" {
		return statusMain(args[1:], stdout, stderr)
	}
	host, _ := os.Hostname()
	cfg, err := parseFlags(args, stdout, host)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "driver: %v\nRun 'driver --help' for the flags.\n", err)
		return 2
	}
	if cfg.showVersion {
		fmt.Fprintln(stdout, "driver", version)
		return 0
	}

	flush, err := command.StartLogging(cfg.logging)
	if err != nil {
		fmt.Fprintf(stderr, "driver: %v\n", err)
		if command.IsFlagError(err) {
			return 2
		}
		return 1
	}
	defer flush()

	ctx := command.SignalContext(klog.NewContext(context.Background(), klog.Background()))
	if err := run(ctx, cfg, net.Listen); err != nil {
		klog.FromContext(ctx).Error(err, "Driver failed")
		return 1
	}
	return 0
}

// parseFlags reads args into a config and validates it; host is the
// default of --node-id. It returns flag.ErrHelp after printing the help for
// -h; any other error is a bad command line.
func parseFlags(args []string, output io.Writer, host string) (*config, error) {
	cfg := &config{logging: logsapi.NewLoggingConfiguration()}
	fs := newFlagSet(cfg, host)
	if err := command.Parse(fs, args, output, "Usage: driver [flags]\n       driver status [flags]\n\nloopvol's CSI driver: the Identity service with the Controller service, the Node service or both on one unix socket.\n'driver status' prints the status of a running node plugin as JSON ('driver status --help')."); err != nil {
		return nil, err
	}
	if cfg.showVersion {
		return cfg, nil
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// newFlagSet declares every flag into a new FlagSet bound to cfg.
func newFlagSet(cfg *config, host string) *flag.FlagSet {
	fs := flag.NewFlagSet("driver", flag.ContinueOnError)
	// The flag package would print the whole help after any mistake; the
	// caller prints the error alone, the help only for -h.
	fs.SetOutput(io.Discard)
	fs.StringVar(&cfg.endpoint, "endpoint", "unix:///csi/csi.sock", "CSI endpoint, unix:///absolute/path of the socket to serve.")
	fs.StringVar(&cfg.mode, "mode", modeAll, "Services to run: controller (Identity + Controller), node (Identity + Node) or all.")
	fs.StringVar(&cfg.driverName, "driver-name", "loopvol.csi.io", "CSI driver name reported by GetPluginInfo.")
	fs.StringVar(&cfg.nodeID, "node-id", host, "ID of this node in attachments and node records (node mode); defaults to the host name.")
	fs.StringVar(&cfg.zone, "zone", "default", "Topology zone of this node and of the pools given with --pool.")
	fs.Var(&cfg.pools, "pool", "Pool of this zone as NAME=PATH (NAME a DNS label, PATH a directory); repeatable.")
	fs.StringVar(&cfg.configFile, "config", "", "YAML file with pools of several zones: pools: [{name, zone, path, reserveBytes}].")
	fs.StringVar(&cfg.kubeletDir, "kubelet-dir", "/var/lib/kubelet", "Staging and target paths must lie under this directory.")
	fs.StringVar(&cfg.podUID, "pod-uid", "", "UID of the node plugin's own Pod (the Downward API's metadata.uid); with it the node's status (kubectl loopvol doctor) tells whether --kubelet-dir is kubelet's directory. Empty: not told.")
	fs.Int64Var(&cfg.maxVolumes, "max-volumes-per-node", 128, "Most volumes attached to this node at once, reported by NodeGetInfo and enforced by ControllerPublishVolume (0: no limit).")
	fs.StringVar(&cfg.httpEndpoint, "http-endpoint", "", "host:port to serve /metrics (CSI call counts and latencies, pool space) and /healthz on; empty: off.")
	fs.StringVar(&cfg.defaultFsType, "default-fstype", volspec.DefaultFsType, "Filesystem of mount volumes whose request names none: ext4 or xfs.")
	fs.StringVar(&cfg.heartbeatNamespace, "heartbeat-namespace", "", "Namespace of this node's heartbeat Lease, renewed by the node plugin (node mode); empty: no heartbeat, so loopvol never fences this node and it never self-fences (docs/fencing.md).")
	fs.StringVar(&cfg.kubeconfig, "kubeconfig", "", "kubeconfig file of the heartbeat's API server; empty: the in-cluster config.")
	fs.DurationVar(&cfg.heartbeatInterval, "heartbeat-interval", heartbeat.DefaultRenewInterval, "Time between two renewals of the heartbeat Lease.")
	fs.DurationVar(&cfg.fencingPeriod, "fencing-period", heartbeat.DefaultFencingPeriod, "How long the heartbeat Lease may go unrenewed before this node may be fenced; written into the Lease, and the same for every node.")
	fs.DurationVar(&cfg.selfFenceAfter, "self-fence-after", heartbeat.DefaultSelfFenceAfter, "How long without a successful renewal before the node freezes its shared-pool volumes itself; shorter than --fencing-period minus --heartbeat-interval and a margin of a fifth of the period.")
	fs.BoolVar(&cfg.showVersion, "version", false, "Print the version and exit.")
	logsapi.AddGoFlags(cfg.logging, fs)
	return fs
}

// validate reports every flag value that cannot work, each naming its flag.
func (c *config) validate() error {
	var errs []error
	switch c.mode {
	case modeController, modeNode, modeAll:
	default:
		errs = append(errs, fmt.Errorf("--mode=%q: want controller, node or all", c.mode))
	}
	if _, err := csiserver.ParseEndpoint(c.endpoint); err != nil {
		errs = append(errs, fmt.Errorf("--endpoint: %w", err))
	}
	if c.driverName == "" {
		errs = append(errs, errors.New("--driver-name must not be empty"))
	}
	if c.zone == "" {
		errs = append(errs, errors.New("--zone must not be empty"))
	}
	if c.maxVolumes < 0 {
		errs = append(errs, errors.New("--max-volumes-per-node must not be negative"))
	}
	if c.serves(modeNode) {
		if err := pool.ValidateNodeID(c.nodeID); err != nil {
			errs = append(errs, fmt.Errorf("--node-id: %w", err))
		}
		if err := node.ValidatePodUID(c.podUID); err != nil {
			errs = append(errs, fmt.Errorf("--pod-uid: %w", err))
		}
	}
	if c.serves(modeController) && c.defaultFsType != "" && !volspec.SupportedFsType(c.defaultFsType) {
		errs = append(errs, fmt.Errorf("--default-fstype=%q: want one of %s", c.defaultFsType, strings.Join(volspec.Filesystems, ", ")))
	}
	if len(c.pools) == 0 && c.configFile == "" {
		errs = append(errs, errors.New("no pools: give --pool NAME=PATH or --config FILE"))
	}
	if c.httpEndpoint != "" {
		if _, _, err := net.SplitHostPort(c.httpEndpoint); err != nil {
			errs = append(errs, fmt.Errorf("--http-endpoint %q is not host:port: %w", c.httpEndpoint, err))
		}
	}
	return errors.Join(append(errs, c.validateHeartbeat()...)...)
}

// serves reports whether the driver runs the service of mode (controller or
// node): in that mode or in all.
func (c *config) serves(mode string) bool { return c.mode == mode || c.mode == modeAll }
