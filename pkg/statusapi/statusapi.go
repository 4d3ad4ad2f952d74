// Package statusapi is the node plugin's status service, beside CSI on the
// driver's socket: what this node's pools hold, which volumes it has
// staged, on which loop devices and mounts, and how healthy they are. It is
// what `driver status` prints as JSON and what `kubectl loopvol` reads from
// every node plugin (through pods/exec: no port is opened for it, and
// reading it takes what exec into the node plugin takes, a cluster
// administrator's right; docs/kubectl-plugin.md).
//
// Like pkg/fenceapi it is gRPC with JSON messages (internal/jsongrpc).
package statusapi

import (
	"context"
	"time"

	"google.golang.org/grpc"

	"github.com/loopvol/loopvol/internal/jsongrpc"
)

// Service and method names on the wire.
const (
	ServiceName      = "loopvol.status.v1.Status"
	NodeStatusMethod = "/" + ServiceName + "/NodeStatus"
)

// NodeStatusRequest asks for the node's status; it has no fields yet.
type NodeStatusRequest struct{}

// NodeStatus is one node plugin's view of its node.
type NodeStatus struct {
	NodeID string `json:"nodeID"`
	Zone   string `json:"zone"`
	// Version is the driver's build.
	Version string `json:"version"`
	// Started is when this incarnation of the plugin started (the
	// LastStart of its node records, the incarnation of its heartbeat).
	Started time.Time `json:"started"`
	// KubeletDir is the kubelet directory the plugin was given: staging and
	// target paths are accepted only under it.
	KubeletDir string `json:"kubeletDir"`
	// KubeletDirHasPod says whether kubelet keeps the plugin's own Pod
	// directory (pods/<its UID>) under KubeletDir: false means KubeletDir
	// is not kubelet's --root-dir, so kubelet never finds the plugin's
	// registration socket. Nil when the plugin was not given its Pod's
	// UID (the driver's --pod-uid).
	KubeletDirHasPod *bool `json:"kubeletDirHasPod,omitempty"`
	// MaxVolumes is the plugin's volume limit (0: none).
	MaxVolumes int64 `json:"maxVolumes,omitempty"`
	// SelfFenced says the plugin lost its heartbeat and froze its
	// shared-pool volumes (docs/fencing.md).
	SelfFenced bool         `json:"selfFenced,omitempty"`
	Pools      []PoolStatus `json:"pools"`
	// Volumes are the volumes this node has staged (its staged records) or
	// holds a loop device of, sorted by ID.
	Volumes []VolumeStatus `json:"volumes"`
	// StrayDevices are loop devices this node's plugin attached whose image
	// is no volume it has staged: left by a crash, or an image replaced
	// under them (a fence).
	StrayDevices []LoopDevice `json:"strayDevices,omitempty"`
}

// PoolStatus is one pool as this node sees it.
type PoolStatus struct {
	Name string `json:"name"`
	Path string `json:"path"`
	// Shared says every node of the zone serves the pool (its directory is
	// a shared filesystem); otherwise it is this node's own.
	Shared bool `json:"shared,omitempty"`
	// The pool's filesystem and its images, as GetCapacity counts them
	// (pool.Usage).
	TotalBytes      int64 `json:"totalBytes"`
	FreeBytes       int64 `json:"freeBytes"`
	PromisedBytes   int64 `json:"promisedBytes"`
	CowReserveBytes int64 `json:"cowReserveBytes,omitempty"`
	AvailableBytes  int64 `json:"availableBytes"`
	Volumes         int   `json:"volumes"`
	OrphanImages    int   `json:"orphanImages,omitempty"`
	OrphanBytes     int64 `json:"orphanBytes,omitempty"`
	// Health is "ok", or the reason NodeGetStorageHealth gives
	// (PoolUnusable, PoolOvercommitted, PoolNearlyFull) with Message.
	Health  string `json:"health"`
	Message string `json:"message,omitempty"`
}

// Health values besides the NodeGetStorageHealth and NodeGetVolumeHealth
// reasons.
const HealthOK = "ok"

// VolumeStatus is one volume on this node.
type VolumeStatus struct {
	VolumeID string `json:"volumeID"`
	Pool     string `json:"pool"`
	Image    string `json:"image"`
	// SizeBytes is the volume's size as its record has it (what was
	// promised); AllocatedBytes what its image holds on the pool's
	// filesystem now (less for a thin volume, shared blocks counted).
	SizeBytes      int64 `json:"sizeBytes,omitempty"`
	AllocatedBytes int64 `json:"allocatedBytes,omitempty"`
	// Staged is when this node recorded it staged; zero when it holds a
	// device of the volume without a record.
	Staged   time.Time `json:"staged,omitempty"`
	ReadOnly bool      `json:"readOnly,omitempty"`
	// Block says the volume is raw block (no filesystem is mounted).
	Block  bool   `json:"block,omitempty"`
	FsType string `json:"fsType,omitempty"`
	// Attached says the volume's record attaches it to this node
	// (ControllerPublish); a staged volume that is not was detached under
	// it (forced, or fenced).
	Attached bool `json:"attached"`
	// Device is the loop device of its image, "" when there is none.
	Device string `json:"device,omitempty"`
	// StagingPath is where the filesystem is mounted for kubelet (mount
	// volumes), TargetPaths where it is published into Pods.
	StagingPath  string   `json:"stagingPath,omitempty"`
	TargetPaths  []string `json:"targetPaths,omitempty"`
	MountOptions []string `json:"mountOptions,omitempty"`
	// Health is "ok" or the first NodeGetVolumeHealth condition's reason;
	// Conditions are all of them.
	Health     string      `json:"health"`
	Conditions []Condition `json:"conditions,omitempty"`
}

// Condition is one abnormal finding about a volume.
type Condition struct {
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// LoopDevice is a loop device and its image.
type LoopDevice struct {
	Device string `json:"device"`
	Image  string `json:"image"`
	// Deleted says the image file was removed or replaced since the
	// device was attached.
	Deleted bool `json:"deleted,omitempty"`
}

// StatusServer is the node plugin's side.
type StatusServer interface {
	NodeStatus(context.Context, *NodeStatusRequest) (*NodeStatus, error)
}

// RegisterStatusServer serves srv on s.
func RegisterStatusServer(s grpc.ServiceRegistrar, srv StatusServer) {
	jsongrpc.Register(s, ServiceName, (*StatusServer)(nil), srv,
		jsongrpc.Method[NodeStatusRequest, NodeStatus]{Name: "NodeStatus", Call: srv.NodeStatus}.Desc(ServiceName))
}

// Client calls the status service over a connection to the driver's socket.
type Client struct{ cc grpc.ClientConnInterface }

// NewClient returns a client of the status service over cc.
func NewClient(cc grpc.ClientConnInterface) *Client { return &Client{cc: cc} }

// NodeStatus asks for the node's status; a driver without a node service
// answers UNIMPLEMENTED.
func (c *Client) NodeStatus(ctx context.Context) (*NodeStatus, error) {
	return jsongrpc.Invoke[NodeStatus](ctx, c.cc, NodeStatusMethod, &NodeStatusRequest{})
}
