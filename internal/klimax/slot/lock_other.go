//go:build !unix

package slot

import (
	"context"
	"sync"
)

// Without flock (klimax runs on macOS and Linux only) claims are serialised
// within one process; every claim counts as live.
var mu sync.Mutex

func lockDir(ctx context.Context, path string) (func(), error) {
	mu.Lock()
	return mu.Unlock, nil
}

func processAlive(pid int) bool { return true }
