// Command driver is the loopvol CSI driver: the Identity service plus the
// Controller service (--mode=controller), the Node service (--mode=node) or
// both (--mode=all) on one unix socket.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/loopvol/loopvol/pkg/controller"
	"github.com/loopvol/loopvol/pkg/csiserver"
	"github.com/loopvol/loopvol/pkg/loop"
	"github.com/loopvol/loopvol/pkg/metrics"
	"github.com/loopvol/loopvol/pkg/node"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/pool/poolmetrics"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"
	"sigs.k8s.io/yaml"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

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

// options are the command-line flags.
type options struct {
	endpoint      string
	mode          string
	driverName    string
	nodeID        string
	zone          string
	pools         poolFlag
	configFile    string
	kubeletDir    string
	maxVolumes    int64
	httpEndpoint  string
	defaultFsType string
	showVersion   bool
}

// configFile is the --config format: pools of several zones, for a
// controller that serves them all.
type configFile struct {
	Pools []struct {
		Name         string `json:"name"`
		Zone         string `json:"zone"`
		Path         string `json:"path"`
		ReserveBytes int64  `json:"reserveBytes"`
	} `json:"pools"`
}

func main() {
	host, _ := os.Hostname()
	var o options
	fs := flag.NewFlagSet(os.Args[0], flag.ContinueOnError)
	fs.StringVar(&o.endpoint, "endpoint", "unix:///csi/csi.sock", "CSI endpoint, unix:///absolute/path of the socket to serve.")
	fs.StringVar(&o.mode, "mode", "all", "Services to run: controller (Identity + Controller), node (Identity + Node) or all.")
	fs.StringVar(&o.driverName, "driver-name", "loopvol.csi.io", "CSI driver name reported by GetPluginInfo.")
	fs.StringVar(&o.nodeID, "node-id", host, "ID of this node in attachments and node records (node mode); defaults to the host name.")
	fs.StringVar(&o.zone, "zone", "default", "Topology zone of this node and of the pools given with --pool.")
	fs.Var(&o.pools, "pool", "Pool of this zone as NAME=PATH (NAME a DNS label, PATH a directory); repeatable.")
	fs.StringVar(&o.configFile, "config", "", "YAML file with pools of several zones: pools: [{name, zone, path, reserveBytes}].")
	fs.StringVar(&o.kubeletDir, "kubelet-dir", "/var/lib/kubelet", "Staging and target paths must lie under this directory.")
	fs.Int64Var(&o.maxVolumes, "max-volumes-per-node", 128, "Most volumes attached to this node at once, reported by NodeGetInfo and enforced by ControllerPublishVolume (0: no limit).")
	fs.StringVar(&o.httpEndpoint, "http-endpoint", "", "host:port to serve /metrics (CSI call counts and latencies, pool space) and /healthz on; empty: off.")
	fs.StringVar(&o.defaultFsType, "default-fstype", "ext4", "Filesystem of mount volumes whose request names none: ext4 or xfs.")
	fs.BoolVar(&o.showVersion, "version", false, "Print the version and exit.")
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	klogFlags.VisitAll(func(f *flag.Flag) { fs.Var(f.Value, f.Name, f.Usage) })

	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2) // the flag package printed what was wrong and the usage
	}
	if o.showVersion {
		fmt.Println(os.Args[0], version)
		return
	}
	ctx := signalContext()
	if err := run(ctx, o); err != nil {
		klog.FromContext(ctx).Error(err, "Driver failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	klog.Flush()
}

// signalContext is cancelled by the first SIGINT or SIGTERM; a second one
// exits at once.
func signalContext() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-ch
		cancel()
		<-ch
		os.Exit(1)
	}()
	return ctx
}

func (o *options) validate() error {
	var errs []error
	switch o.mode {
	case "controller", "node", "all":
	default:
		errs = append(errs, fmt.Errorf("--mode=%q: want controller, node or all", o.mode))
	}
	if _, err := csiserver.ParseEndpoint(o.endpoint); err != nil {
		errs = append(errs, fmt.Errorf("--endpoint: %w", err))
	}
	if o.driverName == "" {
		errs = append(errs, errors.New("--driver-name must not be empty"))
	}
	if o.zone == "" {
		errs = append(errs, errors.New("--zone must not be empty"))
	}
	if o.maxVolumes < 0 {
		errs = append(errs, errors.New("--max-volumes-per-node must not be negative"))
	}
	if o.mode != "controller" {
		if err := pool.ValidateNodeID(o.nodeID); err != nil {
			errs = append(errs, fmt.Errorf("--node-id: %w", err))
		}
	}
	if len(o.pools) == 0 && o.configFile == "" {
		errs = append(errs, errors.New("no pools: give --pool NAME=PATH or --config FILE"))
	}
	return errors.Join(errs...)
}

// openPools opens the pools of --pool (in --zone) and of --config.
func (o *options) openPools() ([]*pool.Pool, error) {
	all := []pool.Options{}
	for _, p := range o.pools {
		p.Zone = o.zone
		all = append(all, p)
	}
	if o.configFile != "" {
		data, err := os.ReadFile(o.configFile)
		if err != nil {
			return nil, fmt.Errorf("--config: %w", err)
		}
		var cf configFile
		if err := yaml.UnmarshalStrict(data, &cf); err != nil {
			return nil, fmt.Errorf("--config %s: %w", o.configFile, err)
		}
		for _, p := range cf.Pools {
			all = append(all, pool.Options{Name: p.Name, Zone: p.Zone, Path: p.Path, ReserveBytes: p.ReserveBytes})
		}
	}
	seen := map[string]bool{}
	var pools []*pool.Pool
	for _, opts := range all {
		if seen[opts.Name] {
			return nil, fmt.Errorf("pool %q is given twice", opts.Name)
		}
		seen[opts.Name] = true
		p, err := pool.Open(opts)
		if err != nil {
			return nil, err
		}
		pools = append(pools, p)
	}
	return pools, nil
}

func run(ctx context.Context, o options) error {
	if err := o.validate(); err != nil {
		return err
	}
	logger := klog.FromContext(ctx)
	pools, err := o.openPools()
	if err != nil {
		return err
	}
	cfg := csiserver.Config{Endpoint: o.endpoint}
	served := pools
	if o.mode != "controller" {
		byName := map[string]*pool.Pool{}
		served = nil
		for _, p := range pools {
			byName[p.Name] = p
			if p.Zone == o.zone {
				served = append(served, p)
			}
		}
		n, err := node.New(node.Config{
			NodeID:     o.nodeID,
			Zone:       o.zone,
			MaxVolumes: o.maxVolumes,
			KubeletDir: o.kubeletDir,
			Pools:      byName,
			Loop:       loop.New(),
			Mounter:    &mount.SafeFormatAndMount{Interface: mount.New(""), Exec: utilexec.New()},
		})
		if err != nil {
			return err
		}
		cfg.Node = n
	}
	if o.mode != "node" {
		// Loop: a volume mounted on this node is frozen for its snapshot.
		c, err := controller.New(controller.Config{Pools: pools, DefaultFsType: o.defaultFsType, Loop: loop.New()})
		if err != nil {
			return err
		}
		c.Start(ctx) // sweeps what killed processes left in the pools, then every 10 minutes
		cfg.Controller = c
		served = pools
	}
	identity := controller.NewIdentity(o.driverName, version, cfg.Controller != nil, served)
	cfg.Identity = identity
	mm := metrics.NewPlugin(o.driverName)
	mm.GetRegistry().RawMustRegister(poolmetrics.Collector{Usage: func() []poolmetrics.Usage {
		return poolmetrics.Measure(served)
	}})
	cfg.Metrics = mm

	srv, err := csiserver.Listen(ctx, cfg)
	if err != nil {
		return err
	}
	if o.httpEndpoint != "" {
		mux := http.NewServeMux()
		mm.RegisterToServer(mux, "/metrics")
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
			resp, err := identity.Probe(r.Context(), nil)
			if err != nil || !resp.GetReady().GetValue() {
				http.Error(w, "not ready: a pool is not usable (see the driver log)", http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ok")
		})
		hs := &http.Server{Addr: o.httpEndpoint, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := hs.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				logger.Error(err, "HTTP endpoint failed", "address", o.httpEndpoint)
			}
		}()
		defer hs.Close()
	}
	var names []string
	for _, p := range served {
		names = append(names, p.Name+"="+p.Path+" ("+p.Zone+")")
	}
	logger.Info("Serving CSI", "endpoint", o.endpoint, "mode", o.mode, "driver", o.driverName, "nodeID", o.nodeID, "pools", names, "version", version)
	return srv.Serve(ctx)
}
