// Package unixsock parses unix:// endpoints and puts listening unix-domain
// sockets in place for the driver (pkg/csiserver) and the sidecar's
// registrar (pkg/registrar), which must not import each other.
//
// A socket gets its mode without touching the process's umask: the umask is
// process-wide, and changing it around bind, as the upstream sidecars do,
// gives every file another goroutine creates at that moment the wrong mode.
// Listen binds inside a fresh owner-only directory next to the final path,
// sets the mode there, where no one else can reach the socket yet, and links
// it into place. A stale socket at the final path (one that refuses
// connections) is replaced; a socket that another process still serves is
// refused, so a second driver started on the same endpoint cannot cut the
// first off, and any other kind of file there is refused, so a wrong flag
// cannot delete someone's data.
// Closing a Listener removes its socket only if the path still holds that
// socket, not one a newer process has put there since.
package unixsock
