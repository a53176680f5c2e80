//go:build !unix

package proxy

import "net"

func readDatagram(c net.Conn, deliver func([]byte)) error { return readDatagramCopy(c, deliver) }
