package apilb

import (
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// setUserTimeout makes the kernel drop the connection when data stays
// unacknowledged for d (TCP_USER_TIMEOUT), instead of retransmitting for
// about 15 minutes.
func setUserTimeout(c *net.TCPConn, d time.Duration) {
	raw, err := c.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) {
		_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d.Milliseconds()))
	})
}
