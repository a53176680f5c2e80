//go:build unix

package proxy

import (
	"net"
	"syscall"
)

// readDatagram reads one datagram from c and hands it to deliver, which
// must not keep it. It waits for readability without a buffer when c
// exposes its descriptor.
func readDatagram(c net.Conn, deliver func([]byte)) error {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return readDatagramCopy(c, deliver)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		bp := bufs.Get().(*[]byte)
		defer bufs.Put(bp)
		for {
			n, err := syscall.Read(int(fd), *bp)
			switch {
			case err == syscall.EINTR:
				continue
			case err == syscall.EAGAIN:
				return false // not readable yet: wait, holding no buffer
			case err != nil:
				rerr = err
			default:
				deliver((*bp)[:n])
			}
			return true
		}
	})
	if err != nil {
		return err
	}
	return rerr
}
