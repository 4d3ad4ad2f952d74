package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/loopvol/loopvol/pkg/statusapi"
)

// The node plugin's container and the command that prints its NodeStatus.
const (
	statusContainer = "driver"
	statusCommand   = "/driver status"
)

// maxStatusBytes bounds what is read of one node's answer: a NodeStatus of
// thousands of volumes is well below it, and a plugin gone wrong cannot
// fill the user's memory.
const maxStatusBytes = 16 << 20

// NodeStatusSource asks a node plugin Pod for its node's status.
type NodeStatusSource interface {
	// NodeStatus returns what the plugin in pod says of its node. An error
	// says why it could not be asked or did not answer; it names the Pod.
	NodeStatus(ctx context.Context, pod *corev1.Pod) (*statusapi.NodeStatus, error)
}

// execSource runs `/driver status` in the driver container of the node
// plugin Pod through pods/exec: the node plugin opens no port for it, and
// reading it takes exactly the right to exec into the plugin.
type execSource struct {
	rest *rest.Config
	kube kubernetes.Interface
}

// NodeStatus implements NodeStatusSource.
func (s *execSource) NodeStatus(ctx context.Context, pod *corev1.Pod) (*statusapi.NodeStatus, error) {
	req := s.kube.CoreV1().RESTClient().Post().
		Resource("pods").Namespace(pod.Namespace).Name(pod.Name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: statusContainer,
			Command:   strings.Fields(statusCommand),
			Stdout:    true,
			Stderr:    true,
		}, scheme.ParameterCodec)
	// As kubectl: WebSocket first, SPDY for an API server or a proxy
	// that does not upgrade to it.
	ws, err := remotecommand.NewWebSocketExecutor(s.rest, "GET", req.URL().String())
	if err != nil {
		return nil, fmt.Errorf("exec into %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	spdy, err := remotecommand.NewSPDYExecutor(s.rest, "POST", req.URL())
	if err != nil {
		return nil, fmt.Errorf("exec into %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	exec, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return nil, fmt.Errorf("exec into %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	stdout, stderr := &limitedBuffer{max: maxStatusBytes}, &limitedBuffer{max: 64 << 10}
	err = exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: stdout, Stderr: stderr})
	return decodeStatus(pod, stdout, stderr.String(), err)
}

// decodeStatus turns what `driver status` wrote and how its exec ended into
// the status, or into an error that names the Pod and carries the
// command's stderr: what the driver says is why it failed.
func decodeStatus(pod *corev1.Pod, stdout *limitedBuffer, stderr string, err error) (*statusapi.NodeStatus, error) {
	where := fmt.Sprintf("%s in %s/%s", statusCommand, pod.Namespace, pod.Name)
	if msg := strings.TrimSpace(stderr); err != nil && msg != "" {
		return nil, fmt.Errorf("%s: %w: %s", where, err, lastLine(msg))
	} else if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	if stdout.truncated {
		return nil, fmt.Errorf("%s: printed more than %d bytes", where, stdout.max)
	}
	var st statusapi.NodeStatus
	if err := json.Unmarshal(stdout.Bytes(), &st); err != nil {
		return nil, fmt.Errorf("%s: its output is no NodeStatus: %w", where, err)
	}
	return &st, nil
}

// lastLine is the last line of s: the error a failing command ends with.
func lastLine(s string) string {
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// limitedBuffer keeps the first max bytes written to it and drops the rest.
type limitedBuffer struct {
	bytes.Buffer
	max       int
	truncated bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); len(p) > room {
		b.truncated = true
		b.Buffer.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return b.Buffer.Write(p)
}

// errNoPlugin is a node's statusErr when no node plugin Pod runs there.
var errNoPlugin = errors.New("no node plugin Pod")

// queryNodes asks the plugin of every node that has one, at most
// opts.parallel at once and each within opts.nodeTimeout, and stores the
// answer or the error in the node's view. A Pod that is not running is not
// asked: exec would only wait.
func (e *env) queryNodes(ctx context.Context, nodes []*nodeView) {
	sem := make(chan struct{}, e.opts.parallel)
	var wg sync.WaitGroup
	for _, n := range nodes {
		switch {
		case n.pod == nil:
			n.statusErr = errNoPlugin
			continue
		case n.pod.Status.Phase != corev1.PodRunning:
			n.statusErr = fmt.Errorf("node plugin Pod %s is %s", n.pod.Name, n.pod.Status.Phase)
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(ctx, e.opts.nodeTimeout)
			defer cancel()
			n.status, n.statusErr = e.nodes.NodeStatus(ctx, n.pod)
			if errors.Is(n.statusErr, context.DeadlineExceeded) {
				n.statusErr = fmt.Errorf("node plugin Pod %s did not answer within %v", n.pod.Name, e.opts.nodeTimeout)
			}
		})
	}
	wg.Wait()
}
