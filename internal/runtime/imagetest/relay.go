package imagetest

import (
	"io"
	"net"
)

// ForwardTCP accepts connections on ln until it is closed and relays each
// to target, dialed from the calling process's network namespace: a
// forwarded port or a VM's relay in front of a registry, so that clients
// reach it under a host name that is not its own.
func ForwardTCP(ln net.Listener, target string) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { io.Copy(up, c); up.(*net.TCPConn).CloseWrite() }()
				io.Copy(c, up)
			}()
		}
	}()
}
