package proxy

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// listenConfig returns how to open a frontend socket. freebind lets an
// IPv4 socket bind an address that no interface holds (yet).
func listenConfig(freebind bool) net.ListenConfig {
	if !freebind {
		return net.ListenConfig{}
	}
	return net.ListenConfig{Control: func(network, _ string, c syscall.RawConn) error {
		if network != "tcp4" && network != "udp4" {
			return nil
		}
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_FREEBIND, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
}
