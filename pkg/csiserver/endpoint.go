package csiserver

import "github.com/loopvol/loopvol/internal/unixsock"

// ParseEndpoint returns the socket path of a "unix:///abs/path" endpoint.
// Other schemes are refused: the driver only ever talks to local sidecars and
// kubelet. It is unixsock.ParseEndpoint, kept here for the driver's command.
func ParseEndpoint(endpoint string) (string, error) {
	return unixsock.ParseEndpoint(endpoint)
}
