package dataplane

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
)

// New returns the darwin dataplane: lo0 aliases and a pf anchor, applied
// by running the commands render.go builds (see loPlane).
func New(o Options) (Dataplane, error) {
	if o.Runner == nil {
		o.Runner = runCommand
	}
	if o.Output == nil {
		o.Output = commandOutput
	}
	d, err := newLoPlane(o)
	if err != nil {
		return nil, err
	}
	d.newWG = newUTUN(o.Logger)
	return d, nil
}

// runCommand runs argv directly, no shell, and puts its output in the
// error so a refusal from ifconfig or pfctl says why.
func runCommand(argv []string) error {
	_, err := commandOutput(argv)
	return err
}

// commandOutput returns stdout and stderr together: pfctl prints its
// token and its warnings on stderr.
func commandOutput(argv []string) ([]byte, error) {
	var out bytes.Buffer
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(out.String()))
	}
	return out.Bytes(), nil
}
