package deploy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/k3sm-dev/k3sm/internal/server/deploy/helmwire"
)

// HelperBinary is the helm helper's file name, next to the k3sm
// executable: the helm SDK lives in a binary of its own, so the processes
// of the k3sm binary do not pay its package initialisation.
const HelperBinary = "k3sm-helm"

// HelperPath is where k3sm looks for k3sm-helm: beside exe.
func HelperPath(exe string) string { return filepath.Join(filepath.Dir(exe), HelperBinary) }

// errHelper is a failure of k3sm-helm itself (missing, crashed, or from
// another build), not of the helm operation it was asked for.
type errHelper struct{ err error }

func (e *errHelper) Error() string { return e.err.Error() }
func (e *errHelper) Unwrap() error { return e.err }

// checkHelper tells whether path is an executable file, naming the fix
// when it is not.
func checkHelper(path string) error {
	fi, err := os.Stat(path)
	if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		return &errHelper{fmt.Errorf("%s not found: the HelmChart controller runs helm in it; build it (make bin/%s, or go build -o %s ./cmd/%s), or run with --disable-helm-controller",
			path, HelperBinary, path, HelperBinary)}
	}
	return nil
}

// stderrKeep bounds the helper's stderr kept for an error message.
const stderrKeep = 8 << 10

// helm runs one operation in k3sm-helm. A failed operation comes back as
// a *helmwire.Error; anything else is an *errHelper.
func (c *Charts) helm(ctx context.Context, req *helmwire.Request) (*helmwire.Response, error) {
	if err := checkHelper(c.Helper); err != nil {
		return nil, err
	}
	req.Kubeconfig = c.Kubeconfig
	body, err := json.Marshal(req)
	if err != nil {
		return nil, &errHelper{fmt.Errorf("%s request: %w", HelperBinary, err)}
	}
	cmd := exec.CommandContext(ctx, c.Helper)
	// SIGTERM lets helm record a failed release instead of leaving it
	// pending; the helper also stops when its stdin closes (k3sm gone).
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, &errHelper{err}
	}
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, &errHelper{err}
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, &errHelper{fmt.Errorf("starting %s: %w", c.Helper, err)}
	}
	// The pipe stays open until the helper exits (Wait closes it).
	if _, err := stdin.Write(body); err != nil {
		c.Log.Debug("writing the request to k3sm-helm", "err", err)
	}
	var tail []string
	sc := bufio.NewScanner(stderr)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	kept := 0
	for sc.Scan() {
		line := sc.Text()
		c.Log.Debug("helm: "+line, "release", req.Namespace+"/"+req.Release)
		tail = append(tail, line)
		kept += len(line)
		for kept > stderrKeep && len(tail) > 1 {
			kept -= len(tail[0])
			tail = tail[1:]
		}
	}
	_, _ = io.Copy(io.Discard, stderr) // past a line too long to scan
	err = cmd.Wait()
	c.Log.Debug("k3sm-helm done", "op", req.Op, "release", req.Namespace+"/"+req.Release, "took", time.Since(start).Round(time.Millisecond).String())
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	var resp helmwire.Response
	if derr := helmwire.Decode(&stdout, &resp); derr != nil || err != nil {
		msg := strings.Join(tail, "\n")
		if err == nil {
			err = derr
		}
		return nil, &errHelper{fmt.Errorf("%s (%s): %w: %s", c.Helper, req.Op, err, msg)}
	}
	if resp.Error != nil {
		if resp.Error.Stage == helmwire.StageHelper {
			return nil, &errHelper{fmt.Errorf("%s: %s", HelperBinary, resp.Error.Message)}
		}
		return nil, resp.Error
	}
	return &resp, nil
}

// stageOf is the stage of a failed operation, or "" for a failure of the
// helper itself.
func stageOf(err error) helmwire.Stage {
	var we *helmwire.Error
	if errors.As(err, &we) {
		return we.Stage
	}
	return ""
}
