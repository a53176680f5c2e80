// Package ports owns how tests and benchmarks pick loopback TCP ports for
// the servers and databases they start: below the kernel's ephemeral range
// and the NodePort range, never handed out twice in one process.
package ports

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
)

var (
	mu    sync.Mutex
	given = map[int]bool{}
)

// Free returns a loopback port no one listens on, in 20000-29999. A port
// the kernel picked (":0") is an ephemeral one: between the caller closing
// it and a server binding it, an outgoing connection can take it as its
// source port and hold it (a scheduler failed to start for that).
func Free() (int, error) {
	mu.Lock()
	defer mu.Unlock()
	for range 2000 {
		p := 20000 + rand.IntN(10000)
		if given[p] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		l.Close()
		given[p] = true
		return p, nil
	}
	return 0, errors.New("no free loopback port in 20000-29999")
}
