// Command kubectl-loopvol is the kubectl plugin of loopvol: `kubectl loopvol
// status`, `volumes`, `describe` and `doctor` show the whole state of the
// storage — the API objects of the driver and of the claims, and what each
// node plugin says of its node (statusapi.NodeStatus, read by exec into the
// node plugin's container) — with the user's kubeconfig and kubectl's
// flags. docs/kubectl-plugin.md is its manual.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "unknown"

// errChecksFailed is what doctor returns when a check failed: its lines
// said everything already, so main only exits 1.
var errChecksFailed = errors.New("a check failed")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	color := os.Getenv("NO_COLOR") == "" && term.IsTerminal(int(os.Stdout.Fd()))
	code := mainWithCode(ctx, os.Args[1:], os.Stdout, os.Stderr, realEnv(color))
	stop()
	os.Exit(code)
}

// mainWithCode runs the command line args and returns the exit code: 0,
// or 1 when the command failed or a doctor check failed.
func mainWithCode(ctx context.Context, args []string, stdout, stderr io.Writer, newEnv envFactory) int {
	root := newRootCommand(newEnv)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errChecksFailed):
		return 1
	default:
		fmt.Fprintf(stderr, "error: %v\n", err)
		return 1
	}
}

// options are the flags every command shares.
type options struct {
	kube            *genericclioptions.ConfigFlags
	driverNamespace string
	driver          string
	output          string
	nodeTimeout     time.Duration
	parallel        int
}

// envFactory makes the clients of one run from the flags; tests give fakes.
type envFactory func(opts *options, out io.Writer) (*env, error)

// realEnv connects to the cluster of the user's kubeconfig; color says
// whether tables may be coloured (stdout is a terminal and NO_COLOR unset).
func realEnv(color bool) envFactory {
	return func(opts *options, out io.Writer) (*env, error) {
		rc, err := opts.kube.ToRESTConfig()
		if err != nil {
			return nil, err
		}
		ns, _, err := opts.kube.ToRawKubeConfigLoader().Namespace()
		if err != nil {
			return nil, err
		}
		kc, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return nil, err
		}
		dc, err := dynamic.NewForConfig(rc)
		if err != nil {
			return nil, err
		}
		return &env{
			kube:      kc,
			dyn:       dc,
			nodes:     &execSource{rest: rc, kube: kc},
			out:       out,
			color:     color,
			now:       time.Now,
			namespace: ns,
			opts:      opts,
		}, nil
	}
}

func newRootCommand(newEnv envFactory) *cobra.Command {
	opts := &options{kube: genericclioptions.NewConfigFlags(true)}
	root := &cobra.Command{
		Use:   "kubectl-loopvol",
		Short: "Show the state of loopvol's storage and find what is wrong with it",
		Long: "kubectl loopvol shows loopvol's storage as the API server and every node plugin see it:\n" +
			"pools and registrations (status), volumes (volumes), the path of one claim (describe),\n" +
			"and checks with what to do when one fails (doctor).",
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl loopvol"},
	}
	pf := root.PersistentFlags()
	opts.kube.AddFlags(pf)
	pf.StringVar(&opts.driverNamespace, "driver-namespace", "loopvol", "Namespace loopvol is installed in (its node plugin Pods, Leases, webhook Service).")
	pf.StringVar(&opts.driver, "driver", "loopvol.csi.io", "Name of loopvol's CSI driver (CSIDriver, PVs' spec.csi.driver, CSINode entries).")
	pf.StringVarP(&opts.output, "output", "o", "", "Output format: json or yaml; empty for tables.")
	pf.DurationVar(&opts.nodeTimeout, "node-timeout", 15*time.Second, "How long each node plugin has to answer /driver status (run through pods/exec).")
	pf.IntVar(&opts.parallel, "node-parallelism", 8, "How many node plugins are asked at the same time.")

	// run wraps a command's body: the flags are checked and the clients
	// made once, before it.
	run := func(body func(ctx context.Context, e *env, args []string) error) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, args []string) error {
			if err := opts.validate(); err != nil {
				return err
			}
			e, err := newEnv(opts, cmd.OutOrStdout())
			if err != nil {
				return err
			}
			return body(cmd.Context(), e, args)
		}
	}
	root.AddCommand(newStatusCommand(run), newVolumesCommand(run), newDescribeCommand(run), newDoctorCommand(run))
	return root
}

// runner is what newRootCommand hands each command to wrap its body.
type runner func(body func(ctx context.Context, e *env, args []string) error) func(*cobra.Command, []string) error

func (o *options) validate() error {
	switch o.output {
	case "", "json", "yaml":
	default:
		return fmt.Errorf("--output %q: want json or yaml", o.output)
	}
	if o.nodeTimeout <= 0 {
		return fmt.Errorf("--node-timeout %v: must be positive", o.nodeTimeout)
	}
	if o.parallel < 1 {
		return fmt.Errorf("--node-parallelism %d: must be at least 1", o.parallel)
	}
	if o.driver == "" || o.driverNamespace == "" {
		return errors.New("--driver and --driver-namespace must not be empty")
	}
	return nil
}
