package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/loopvol/loopvol/internal/command"
	"github.com/loopvol/loopvol/internal/unixsock"
	"github.com/loopvol/loopvol/pkg/statusapi"
)

// endpointEnv names the environment variable that holds the node plugin's
// endpoint in its container (deploy/kubernetes/base/node.yaml): `driver
// status`, run there through pods/exec, finds the driver's socket by it.
const endpointEnv = "CSI_ENDPOINT"

// statusMain is `driver status`: it asks the driver serving --endpoint for
// the status of its node (pkg/statusapi) and prints it as JSON. It is what
// `kubectl loopvol` runs in every node plugin's container, through
// pods/exec, so that reading a node's state opens no port. It returns the
// exit code: 0 with the status printed, 1 when the driver could not be
// asked, 2 for a bad command line.
func statusMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("driver status", flag.ContinueOnError)
	endpoint := fs.String("endpoint", os.Getenv(endpointEnv), "CSI endpoint of the running node plugin, unix:///absolute/path; defaults to $"+endpointEnv+".")
	timeout := fs.Duration("timeout", 20*time.Second, "How long to wait for the driver's answer.")
	err := command.Parse(fs, args, stdout, "Usage: driver status [flags]\n\nPrint the status of the node plugin serving --endpoint as JSON: its pools, the volumes it has staged with their loop devices, mounts and health, and its stray loop devices.")
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case err == nil && *endpoint == "":
		err = fmt.Errorf("no endpoint: give --endpoint or set $%s", endpointEnv)
	case err == nil && *timeout <= 0:
		err = fmt.Errorf("--timeout=%s must be positive", *timeout)
	}
	var path string
	if err == nil {
		if path, err = unixsock.ParseEndpoint(*endpoint); err != nil {
			err = fmt.Errorf("--endpoint: %w", err)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "driver status: %v\nRun 'driver status --help' for the flags.\n", err)
		return 2
	}
	st, err := nodeStatus(path, *timeout)
	if err != nil {
		fmt.Fprintf(stderr, "driver status: %v\n", err)
		return 1
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(st); err != nil {
		fmt.Fprintf(stderr, "driver status: %v\n", err)
		return 1
	}
	return 0
}

// nodeStatus asks the driver on the socket at path for its node's status.
func nodeStatus(path string, timeout time.Duration) (*statusapi.NodeStatus, error) {
	cc, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", path, err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	st, err := statusapi.NewClient(cc).NodeStatus(ctx)
	if err != nil {
		return nil, fmt.Errorf("node status from %s: %w", path, err)
	}
	return st, nil
}
