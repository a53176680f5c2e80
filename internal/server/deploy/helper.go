package deploy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/k3sm-dev/k3sm/internal/server/deploy/helmwire"
	"github.com/k3sm-dev/k3sm/internal/supervisor"
)

// HelperBinary is the helm helper's file name, next to the k3sm
// executable: the helm SDK lives in a binary of its own, so the processes
// of the k3sm binary do not pay its package initialisation.
const HelperBinary = "k3sm-helm"

// errHelper is a failure of k3sm-helm itself (missing, crashed, or from
// another build), not of the helm operation it was asked for.
type errHelper struct{ err error }

func (e *errHelper) Error() string { return e.err.Error() }
func (e *errHelper) Unwrap() error { return e.err }

// helper finds k3sm-helm beside c.Exe, naming the fix when it is not
// there.
func (c *Charts) helper() (string, error) {
	p, err := supervisor.Beside(c.Exe, HelperBinary)
	if err != nil {
		return "", &errHelper{fmt.Errorf("the HelmChart controller runs helm in %s: %w, or run with --disable-helm-controller", HelperBinary, err)}
	}
	return p, nil
}

// stderrKeep bounds the helper's stderr kept for an error message.
const stderrKeep = 8 << 10

// helm runs one operation in k3sm-helm. A failed operation comes back as
// a *helmwire.Error; anything else is an *errHelper.
func (c *Charts) helm(ctx context.Context, req *helmwire.Request) (*helmwire.Response, error) {
	helper, err := c.helper()
	if err != nil {
		return nil, err
	}
	req.Kubeconfig = c.Kubeconfig
	body, err := json.Marshal(req)
	if err != nil {
		return nil, &errHelper{fmt.Errorf("%s request: %w", HelperBinary, err)}
	}
	cmd := exec.CommandContext(ctx, helper)
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
		return nil, &errHelper{fmt.Errorf("starting %s: %w", helper, err)}
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
		return nil, &errHelper{fmt.Errorf("%s (%s): %w: %s", helper, req.Op, err, msg)}
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
