package imagetest

// The alloc op of the test program:
//
//	alloc:SIZE  allocate SIZE bytes (a quantity: 200Mi, 1Gi, 4096) and
//	            write every page, so all of it is resident, then go on;
//	            the memory stays allocated until the program exits
func init() { progFiles["alloc.go"] = allocSource }

const allocSource = `package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// held keeps what alloc allocated reachable: the GC must not free it.
var held [][]byte

func init() {
	extraOps["alloc"] = func(arg string) {
		n, err := parseSize(arg)
		if err != nil {
			fmt.Fprintln(os.Stderr, "alloc:", err)
			os.Exit(2)
		}
		b := make([]byte, n)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		held = append(held, b)
		fmt.Printf("allocated %d bytes\n", n)
	}
}

func parseSize(s string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		n      int64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}} {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = v, u.n
			break
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("size %q: want a number of bytes, optionally with Ki, Mi or Gi", s)
	}
	return v * mult, nil
}
`
