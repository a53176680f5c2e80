//go:build linux

package stats

import "testing"

func TestParseStat(t *testing.T) {
	line := []byte("1234 (my (odd) prog) S 1 777 777 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 100 1000000 321 18446744073709551615")
	g, ticks, rss, ok := parseStat(line)
	if !ok || g != 777 || ticks != 300 || rss != 321 {
		t.Fatalf("got pgrp %d ticks %d rss %d ok %v", g, ticks, rss, ok)
	}
}
