package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/k3sm-dev/k3sm/internal/klimax/vm"
)

// debugRunner logs every guest command with its duration and result (--debug).
type debugRunner struct {
	vm.Runner
	mu sync.Mutex
	w  io.Writer
}

func (d *debugRunner) Run(ctx context.Context, argv []string, opts vm.RunOptions) (vm.Result, error) {
	start := time.Now()
	res, err := d.Runner.Run(ctx, argv, opts)
	d.mu.Lock()
	defer d.mu.Unlock()
	status := "ok"
	if err != nil {
		status = "error: " + err.Error()
	}
	fmt.Fprintf(d.w, "debug: + %s (%s, %s)\n", strings.Join(argv, " "), time.Since(start).Round(time.Millisecond), status)
	return res, err
}
