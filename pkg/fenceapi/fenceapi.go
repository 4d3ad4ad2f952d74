// Package fenceapi is the driver's fencing service, beside CSI on the
// driver's socket: what the sidecar's fencing controller calls when a node
// has stopped renewing its heartbeat (docs/fencing.md).
//
// CSI has no call that says "this node is gone, take its volumes from it":
// ControllerUnpublishVolume detaches one volume from a node on the CO's
// word, and the attachment is the CO's to remove. FenceNode leaves every
// attachment as it is (kube-controller-manager still detaches, at once once
// the node is out of service) and makes sure the node no longer reaches any
// volume it had staged, so that the detach that follows is safe. ceph-csi
// has the same split with csi-addons' NetworkFence.
//
// The service is gRPC with JSON messages (internal/jsongrpc), not
// protobuf: two plain structs need no code generator in the build, and the
// sidecar and the driver are always built together.
package fenceapi

import (
	"context"
	"time"

	"google.golang.org/grpc"

	"github.com/loopvol/loopvol/internal/jsongrpc"
)

// Service and method names on the wire.
const (
	ServiceName     = "loopvol.fence.v1.Fence"
	FenceNodeMethod = "/" + ServiceName + "/FenceNode"
)

// FenceNodeRequest asks to fence a node from every shared-pool volume it
// has staged.
type FenceNodeRequest struct {
	// NodeID is the node's ID, as in its staged records.
	NodeID string `json:"nodeID"`
	// Through is the last incarnation of the node's plugin that the caller
	// knows stopped (the incarnation its heartbeat carried): records of
	// incarnations that started later stay, so a node that came back and
	// staged anew keeps its claim. The zero time means every incarnation up
	// to the call.
	Through time.Time `json:"through"`
	// AllowCopy lets the fence of a filesystem volume on a pool without
	// reflink be a full copy of its image (the node is known not to
	// write: its own self-fence froze the volume, or the node is down).
	AllowCopy bool `json:"allowCopy,omitempty"`
}

// FenceNodeResponse says what became of each volume the node had staged.
type FenceNodeResponse struct {
	Volumes []FencedVolume `json:"volumes"`
	// PoolErrors are the pools whose staged records could not be listed:
	// the node's volumes there were not looked at, and the fence is to be
	// retried (those of the other pools are in Volumes all the same).
	PoolErrors []string `json:"poolErrors,omitempty"`
}

// FencedVolume is one volume the node had staged.
type FencedVolume struct {
	VolumeID string `json:"volumeID"`
	// Pool is the pool its image lives in.
	Pool string `json:"pool"`
	// Fenced says the node no longer reaches the volume: its image was
	// replaced now (Method) or before, and its staged record is gone.
	Fenced bool `json:"fenced"`
	// Method is how the image was replaced now: "reflink" or "copy"; empty
	// when nothing was replaced.
	Method string `json:"method,omitempty"`
	// Seconds is how long its fence took.
	Seconds float64 `json:"seconds,omitempty"`
	// Reason says, when Fenced is false, why not, for an event a user reads:
	// a local pool, other nodes staging it, read-only, no reflink.
	Reason string `json:"reason,omitempty"`
	// Error is a failure that a retry may not meet (the volume's lock held
	// by another call, an I/O error): the caller calls again.
	Error string `json:"error,omitempty"`
}

// FenceServer is the driver's side.
type FenceServer interface {
	FenceNode(context.Context, *FenceNodeRequest) (*FenceNodeResponse, error)
}

// RegisterFenceServer serves srv on s.
func RegisterFenceServer(s grpc.ServiceRegistrar, srv FenceServer) {
	jsongrpc.Register(s, ServiceName, (*FenceServer)(nil), srv,
		jsongrpc.Method[FenceNodeRequest, FenceNodeResponse]{Name: "FenceNode", Call: srv.FenceNode}.Desc(ServiceName))
}

// Client is the sidecar's side.
type Client struct{ cc grpc.ClientConnInterface }

// NewClient calls the fencing service over cc (the driver's socket).
func NewClient(cc grpc.ClientConnInterface) *Client { return &Client{cc: cc} }

// FenceNode fences a node; a driver without the service answers
// UNIMPLEMENTED.
func (c *Client) FenceNode(ctx context.Context, req *FenceNodeRequest) (*FenceNodeResponse, error) {
	return jsongrpc.Invoke[FenceNodeResponse](ctx, c.cc, FenceNodeMethod, req)
}
