// Command k3sm-helm runs one helm operation for k3sm's HelmChart
// controller: it reads a helmwire.Request as JSON on stdin and writes a
// helmwire.Response as JSON on stdout; helm's debug lines go to stderr.
// The helm SDK lives here and not in the k3sm binary, so that none of the
// server's processes pays its package initialisation.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/k3sm-dev/k3sm/internal/server/deploy/helmop"
	"github.com/k3sm-dev/k3sm/internal/server/deploy/helmwire"
)

func main() { os.Exit(run(os.Stdin, os.Stdout, os.Stderr)) }

func run(stdin io.Reader, stdout, stderr io.Writer) int {
	if isTerminal(stdin) {
		fmt.Fprintln(stderr, "k3sm-helm is run by `k3sm server` (its HelmChart controller), with a request on stdin; it is not a command to run by hand")
		return 2
	}
	var req helmwire.Request
	// One JSON document, then stdin stays open until k3sm closes it.
	dec := json.NewDecoder(io.LimitReader(stdin, helmwire.MaxRequest))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return respond(stdout, stderr, &helmwire.Response{Error: &helmwire.Error{Stage: helmwire.StageHelper,
			Message: fmt.Sprintf("reading the request: %v (are k3sm and k3sm-helm from the same build? make bin/k3sm bin/k3sm-helm)", err)}})
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// EOF on stdin: k3sm is gone, so nobody waits for the outcome.
	go func() {
		_, _ = io.Copy(io.Discard, dec.Buffered())
		_, _ = io.Copy(io.Discard, stdin)
		cancel()
	}()
	resp := helmop.Run(ctx, &req, func(line string) { fmt.Fprintln(stderr, line) })
	return respond(stdout, stderr, resp)
}

func respond(stdout, stderr io.Writer, resp *helmwire.Response) int {
	if err := json.NewEncoder(stdout).Encode(resp); err != nil {
		fmt.Fprintln(stderr, "k3sm-helm: writing the response:", err)
		return 1
	}
	return 0
}

func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
