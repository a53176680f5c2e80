//go:build !linux

package proxy

import "net"

// listenConfig returns how to open a frontend socket; only Linux can bind
// an address no interface holds.
func listenConfig(bool) net.ListenConfig { return net.ListenConfig{} }
