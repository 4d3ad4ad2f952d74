// Package volspec is the vocabulary loopvol's two CSI services share, so
// that pkg/controller and pkg/node, which never import each other, say the
// same thing in the same words:
//
//   - the topology key of a pool's zone (TopologyKey);
//   - the filesystems a mount volume may have (Filesystems, DefaultFsType);
//   - the access-mode rules: which modes exist, which read only, which
//     allow a single node, which only a raw block volume may have;
//   - the kinds of failure of the CSI code map (ErrInvalid, ErrNotFound, …),
//     errors carrying a kind and a message of their own (Errorf, NewKind),
//     and the one mapping from those kinds to gRPC status codes (Status),
//     which each service calls at its edge with the codes of the
//     sentinels of the packages below it (pkg/pool, pkg/loop).
//
// It is a leaf: it imports the CSI spec and gRPC's codes, nothing of loopvol.
package volspec
