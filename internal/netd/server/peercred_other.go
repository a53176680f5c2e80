//go:build !linux && !darwin

package server

import (
	"errors"
	"net"
)

// peerUID refuses: without the kernel's word on the peer, nobody may call.
func peerUID(*net.UnixConn) (int, error) {
	return -1, errors.New("peer credentials are not supported on this OS")
}
