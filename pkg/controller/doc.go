// Package controller implements loopvol's CSI Identity and Controller services
// on top of pkg/pool: it validates every request before anything touches the
// disk, takes the per-volume lock (busy → ABORTED), looks the volume up and
// acts. ControllerPublishVolume is fencing: it records the attachment in the
// volume record, and node plugins refuse to stage a volume that is not
// attached to them.
//
// Errors from pkg/pool are wrapped sentinels; toStatus turns them into gRPC
// codes in one place.
package controller
