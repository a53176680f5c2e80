package pod

// Exec: a command resolved as the container would run it, entering its
// sandbox.

import (
	"errors"

	"google.golang.org/protobuf/proto"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
)

// ResolveExec resolves a command as the container would run it; tty is
// the terminal device it will run on ("" none).
func (m *Manager) ResolveExec(info ContainerInfo, command []string, tty string) (argv, env []string, dir string, err error) {
	cs := proto.Clone(info.Spec).(*runtimev1.ContainerSpec)
	cs.Command, cs.Args = command, nil
	if cs.GetImage() != NativeImage && info.Image == nil {
		return nil, nil, "", errors.New("container has not started yet")
	}
	root := info.Root
	if info.Sandboxed && info.Image == nil {
		root = nativeRoot
	}
	r, err := resolveProcess(info.Pod, cs, info.Image, root, info.Sandboxed)
	if err != nil {
		return nil, nil, "", err
	}
	r.fillPodIP(info.PodIP)
	argv, dir, err = m.enter(info.Sandboxed, info.StateDir, info.Pid, r.Dir, r.Argv, tty)
	return argv, r.Env, dir, err
}
