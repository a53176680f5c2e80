// Package traffic holds the client side of the TCP measurements that
// bench/proxy and bench/podnet share: a bulk upload acknowledged with its
// byte count, and 1-byte round trips. The connection is the caller's, so
// each benchmark dials the way its path needs (loopback, a pod's netns).
package traffic

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"time"
)

// Upload sends 'u' and then n bytes in writes of chunk, half-closes, and
// reads the backend's count (big-endian int64). It returns MB/s (10^6
// bytes) from the first write to the acknowledgement.
func Upload(c *net.TCPConn, n int64, chunk int) (float64, error) {
	if _, err := c.Write([]byte{'u'}); err != nil {
		return 0, err
	}
	buf := make([]byte, chunk)
	for i := range buf {
		buf[i] = byte(i)
	}
	t0 := time.Now()
	for left := n; left > 0; {
		w := buf[:min(int64(len(buf)), left)]
		if _, err := c.Write(w); err != nil {
			return 0, err
		}
		left -= int64(len(w))
	}
	if err := c.CloseWrite(); err != nil {
		return 0, err
	}
	var got int64
	if err := binary.Read(c, binary.BigEndian, &got); err != nil {
		return 0, err
	}
	d := time.Since(t0)
	if got != n {
		return 0, fmt.Errorf("backend got %d bytes of %d", got, n)
	}
	return float64(n) / d.Seconds() / 1e6, nil
}

// RoundTrips sends 'p' and then n 1-byte pings, each echoed, and returns
// the median and 99th percentile round trip.
func RoundTrips(c net.Conn, n int) (p50, p99 time.Duration, err error) {
	if _, err := c.Write([]byte{'p'}); err != nil {
		return 0, 0, err
	}
	r := bufio.NewReader(c)
	rtts := make([]time.Duration, n)
	b := []byte{'x'}
	for i := range n {
		t0 := time.Now()
		if _, err := c.Write(b); err != nil {
			return 0, 0, err
		}
		if _, err := r.ReadByte(); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return 0, 0, err
		}
		rtts[i] = time.Since(t0)
	}
	slices.Sort(rtts)
	return rtts[n/2], rtts[min(n-1, n*99/100)], nil
}
