//go:build linux

package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/k3sm-dev/k3sm/bench/internal/isolated"

	"golang.org/x/sys/unix"

	"github.com/k3sm-dev/k3sm/bench/internal/traffic"
	"github.com/k3sm-dev/k3sm/internal/runtime/podnet"
)

// serverPort is where every path's server listens, inside its namespace.
const serverPort = 5201

// A traffic path, in the order of the report's columns.
const (
	pathMesh     = iota // pod A1 on node A to pod B1 on node B, over the k3sm mesh
	pathBare            // bare wireguard-go: namespace 1 to namespace 2 over their tunnel addresses
	pathSameNode        // pod A1 to pod A2, both on node A, over the bridge
	nPaths
)

var pathNames = [nPaths]string{"k3sm mesh, cross-node", "bare wireguard-go", "same node"}

// path is where a path's client and server run.
type path struct {
	clientNS, serverNS string
	server             netip.AddrPort
}

// round is one measurement of one path.
type round struct {
	mbps     float64 // MB/s (10^6 bytes) received by the server
	bytes    int64   // bytes the server received
	p50, p99 time.Duration
	mss      int // the client socket's MSS (TCP_MAXSEG) on the throughput connection
}

// serve answers two protocols, chosen by the first byte: 'u' reads until
// EOF and answers with the data bytes received and the nanoseconds from
// the mode byte's arrival to EOF (two big-endian int64s); 'p' echoes
// every byte at once (traffic.RoundTrips).
func serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			var mode [1]byte
			if _, err := io.ReadFull(c, mode[:]); err != nil {
				return
			}
			switch mode[0] {
			case 'u':
				t0 := time.Now()
				buf := make([]byte, 256<<10)
				var n int64
				for {
					k, err := c.Read(buf)
					n += int64(k)
					if err == io.EOF {
						break
					}
					if err != nil {
						return
					}
				}
				d := time.Since(t0)
				_ = binary.Write(c, binary.BigEndian, [2]int64{n, d.Nanoseconds()})
			case 'p':
				var b [1]byte
				for {
					if _, err := io.ReadFull(c, b[:]); err != nil {
						return
					}
					if _, err := c.Write(b[:]); err != nil {
						return
					}
				}
			}
		}()
	}
}

// dial connects from the namespace ns; the first packet of a path over
// WireGuard waits for the handshake.
func dial(ctx context.Context, ns string, addr netip.AddrPort) (*net.TCPConn, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := podnet.Dial(ctx, ns, "tcp4", addr.String())
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// upload writes chunk-byte buffers for d from ns to addr, one stream,
// then half-closes; the server measures what it received.
func upload(ctx context.Context, ns string, addr netip.AddrPort, d time.Duration, chunk int) (r round, err error) {
	c, err := dial(ctx, ns, addr)
	if err != nil {
		return r, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	if err := c.SetDeadline(time.Now().Add(d + 30*time.Second)); err != nil {
		return r, err
	}
	if _, err := c.Write([]byte{'u'}); err != nil {
		return r, err
	}
	buf := make([]byte, chunk)
	for i := range buf {
		buf[i] = byte(i)
	}
	for t0 := time.Now(); time.Since(t0) < d; {
		if _, err := c.Write(buf); err != nil {
			return r, err
		}
	}
	r.mss = mss(c)
	if err := c.CloseWrite(); err != nil {
		return r, err
	}
	var res [2]int64
	if err := binary.Read(c, binary.BigEndian, &res); err != nil {
		return r, fmt.Errorf("the server's count: %w", err)
	}
	if res[0] <= 0 || res[1] <= 0 {
		return r, fmt.Errorf("the server received %d bytes in %d ns", res[0], res[1])
	}
	r.bytes = res[0]
	r.mbps = float64(res[0]) / (float64(res[1]) / 1e9) / 1e6
	return r, nil
}

// mss is the connection's current MSS, or 0 if it cannot be read.
func mss(c *net.TCPConn) int {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	var v int
	_ = rc.Control(func(fd uintptr) { v, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG) })
	return v
}

// pings measures n 1-byte round trips on one connection from ns.
func pings(ctx context.Context, ns string, addr netip.AddrPort, n int) (p50, p99 time.Duration, err error) {
	c, err := dial(ctx, ns, addr)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	if err := c.SetDeadline(time.Now().Add(time.Duration(n)*10*time.Millisecond + 30*time.Second)); err != nil {
		return 0, 0, err
	}
	return traffic.RoundTrips(c, n)
}

func measure(ctx context.Context, p path, o options) (round, error) {
	r, err := upload(ctx, p.clientNS, p.server, o.duration, o.chunk)
	if err != nil {
		return r, fmt.Errorf("throughput: %w", err)
	}
	if r.p50, r.p99, err = pings(ctx, p.clientNS, p.server, o.pings); err != nil {
		return r, fmt.Errorf("round trips: %w", err)
	}
	return r, nil
}

// warmUp runs each path briefly before the rounds: the WireGuard
// handshakes happen here, not inside a measurement.
func warmUp(ctx context.Context, paths [nPaths]path, o options) error {
	for i, p := range paths {
		if _, _, err := pings(ctx, p.clientNS, p.server, 200); err != nil {
			return fmt.Errorf("%s (%v): warm-up: %w", pathNames[i], p.server, err)
		}
		if _, err := upload(ctx, p.clientNS, p.server, 500*time.Millisecond, o.chunk); err != nil {
			return fmt.Errorf("%s (%v): warm-up: %w", pathNames[i], p.server, err)
		}
	}
	return nil
}

// runRounds serves every path, warms them up and measures each o.rounds
// times, rotating which path goes first.
func runRounds(ctx context.Context, paths [nPaths]path, o options) (out [nPaths][]round, err error) {
	for i, p := range paths {
		ln, err := isolated.ListenIn(p.serverNS, net.JoinHostPort("0.0.0.0", strconv.Itoa(int(p.server.Port()))))
		if err != nil {
			return out, fmt.Errorf("%s: server: %w", pathNames[i], err)
		}
		defer ln.Close()
		go serve(ln)
	}
	if err := warmUp(ctx, paths, o); err != nil {
		return out, err
	}
	for i := range o.rounds {
		for k := range nPaths {
			pi := (i + k) % nPaths
			if err := ctx.Err(); err != nil {
				return out, err
			}
			r, err := measure(ctx, paths[pi], o)
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
			if err != nil {
				return out, fmt.Errorf("round %d, %s (%v): %w", i+1, pathNames[pi], paths[pi].server, err)
			}
			out[pi] = append(out[pi], r)
			fmt.Fprintf(os.Stderr, "round %d %-22s %8.1f MB/s  p50 %v  p99 %v  mss %d\n", i+1, pathNames[pi], r.mbps, r.p50, r.p99, r.mss)
		}
	}
	return out, nil
}
