// Package capacity is the CSIStorageCapacity controller of the loopvol
// sidecar: a drop-in replacement for the capacity controller of the
// upstream external-provisioner (--enable-capacity), event-driven where
// upstream polls.
//
// It keeps exactly one CSIStorageCapacity object per item, a (StorageClass,
// topology segment) pair:
//
//   - classes: every StorageClass whose provisioner is the driver, with
//     WaitForFirstConsumer binding (and Immediate with
//     Config.ImmediateBinding);
//   - segments: for a central controller, those of the nodes where the
//     driver runs — for each CSINode that lists the driver, the values of
//     its topologyKeys among the Node's labels (a node still missing one is
//     skipped), each distinct segment once; a driver without topology has
//     the one empty segment. With Config.NodeName (--node-deployment) the
//     one segment is the node's own NodeGetInfo accessible topology.
//
// Each object is named csisc-<random>, carries the labels
// csi.storage.k8s.io/drivername=<driver> and
// csi.storage.k8s.io/managed-by=external-provisioner (per node:
// external-provisioner-<node>, shortened as upstream does), and holds the
// class name, the segment as nodeTopology matchLabels, and the driver's
// GetCapacity answer (parameters: the class's; accessible_topology: the
// segment) as capacity and maximumVolumeSize. Labels and fields are
// upstream's, so objects made by external-provisioner are adopted, and the
// other way round.
//
// The sync of an item is level-driven: it reads the class, the segment set
// and the item's objects from the caches; deletes every object of an item
// that is no longer wanted; otherwise asks the driver, keeps one object
// (the one with the right owner, else the oldest), deletes duplicates,
// creates the object if none exists and otherwise patches only the fields
// that differ (capacity, maximumVolumeSize, owner). Nothing is written when
// nothing changed. A write the cache does not show yet stands in for the
// cached copy, so a lagging watch never causes a second create or patch.
//
// What queues an item:
//
//   - a PersistentVolume of the driver created, resized or deleted: the
//     items of the segments its node affinity allows (all when it names
//     none), for every class, refreshed at once and, during a burst, at
//     most once per Config.RefreshDelay;
//   - a class added, changed or deleted; a segment appearing or vanishing
//     with a CSINode or a Node label change: the items it adds or removes;
//   - one of the controller's objects deleted or edited by someone else:
//     it is restored (the controller's own writes coming back queue
//     nothing);
//   - the poll (Config.PollInterval), for capacity that changed behind
//     Kubernetes' back;
//   - Run's start: every wanted item and every existing object.
//
// The queue (QueueName, as upstream) holds items, so a burst of events
// for one item costs one sync. Metrics: csistoragecapacities_desired_goal,
// csistoragecapacities_desired_current and csistoragecapacities_obsolete,
// computed at scrape time; GetCapacity latency is csi_sidecar_operations_seconds
// of the driver connection.
package capacity
