//go:build !linux

package apilb

import (
	"net"
	"time"
)

// setUserTimeout: no TCP_USER_TIMEOUT here; keepalive alone finds a dead
// server (darwin's TCP_CONNECTIONTIMEOUT covers only the handshake).
func setUserTimeout(*net.TCPConn, time.Duration) {}
