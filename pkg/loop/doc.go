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
// Every device has an owner, the node plugin that attached it (New with
// Owner, the node ID): LOOP_CONFIGURE writes the owner's tag (OwnerTag)
// into the device's lo_file_name in the same call that binds the image,
// and every lookup reads it back (LOOP_GET_STATUS64). Find and List pass
// over other owners' devices, and the calls that change or describe a
// device refuse them (ErrNotOwned): two node plugins that share a kernel
// (a test cluster of two kubelets on one machine, a shared pool) never
// find, reuse, grow, tune or detach each other's devices, even for the
// same image, as real nodes could not. Devices without a tag, attached by
// a loopvol from before owners (or by losetup), are every owner's, so a
// node plugin still finds its predecessor's after an upgrade.
//
// Devices are attached without LO_FLAGS_AUTOCLEAR on purpose: autoclear
// detaches a device when its last opener closes it, and a staged raw-block
// volume is held open by nobody between NodeStageVolume and the pod starting.
// Callers detach explicitly.
//
// The package imports only the standard library and x/sys; its errors wrap
// the sentinels below or the errno of the failed call.
package loop
