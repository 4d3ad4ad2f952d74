// Command pause is the sandbox ("infra") container's process of the
// one-node cluster's pods: containerd's sandbox_image and kubelet's pod
// infra image run it as the first process of every pod. It holds the pod's
// namespaces open, reaps the zombies that end up with it (it is PID 1 of
// the pod when the pod shares its PID namespace) and exits when it is asked
// to stop (SIGTERM or SIGINT).
//
// It is built static (CGO_ENABLED=0) by build.sh and put into the image
// localhost/loopvol/pause by hack/images.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// version is set by build.sh (-X main.version): a hash of this source.
var version = "dev"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("pause", version)
		return
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	children := make(chan os.Signal, 1)
	signal.Notify(children, syscall.SIGCHLD)
	for {
		select {
		case s := <-stop:
			fmt.Fprintf(os.Stderr, "pause: %v, exiting\n", s)
			os.Exit(0)
		case <-children:
			reap()
		}
	}
}

// reap collects every child that has exited, without blocking.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
