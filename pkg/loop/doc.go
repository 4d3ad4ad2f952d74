// Package loop attaches volume images to Linux loop devices and finds,
// resizes and detaches them again, through ioctls on /dev/loop-control and
// /dev/loopN and the loop attributes in sysfs.
//
// The package keeps no state: which image backs which device is read from
// /sys/block/loopN/loop/backing_file every time, so a node plugin that
// restarts finds its devices again. Devices are attached with direct I/O
// (LO_FLAGS_DIRECT_IO) so the data does not pass through the page cache twice,
// once for the loop device and once for the image file.
//
// Devices are attached without LO_FLAGS_AUTOCLEAR on purpose: autoclear
// detaches a device when its last opener closes it, and a staged raw-block
// volume is held open by nobody between NodeStageVolume and the pod starting.
// Callers detach explicitly.
//
// The package imports only the standard library and x/sys; its errors wrap
// the sentinels below or the errno of the failed call.
package loop
