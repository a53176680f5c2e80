//go:build linux

package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A runtime that is not root gives a pod its own network (from k3sm-netd)
// through namespaces of its own: a user namespace mapping the pod's ids
// (RootlessIDs) that owns a network namespace, both made by a short-lived
// holder process (the shim binary with HoldArg) that netd then pins. The
// pod's shims run inside them (EnterPodArgv), so each container's init is
// root of that one user namespace, shared by the pod's containers as the
// network is; and port-forward dials from inside (DialArg).

// Arguments of the shim binary's pod-namespace modes.
const (
	HoldArg = "hold"
	DialArg = "dial"
)

// PodNamespaces is a holder of a pod's new user and network namespaces.
type PodNamespaces struct {
	Pid  int
	cmd  *exec.Cmd
	stop io.Closer
}

// Close ends the holder (the namespaces live on where netd pinned them).
func (h *PodNamespaces) Close() error {
	h.stop.Close()
	return h.cmd.Wait()
}

// NewPodNamespaces starts the holder (shim is the shim binary) in a new
// user namespace with the rootless maps and a new network namespace it
// owns.
func NewPodNamespaces(shim string) (*PodNamespaces, error) {
	uidMap, gidMap, _ := RootlessIDs()
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := exec.Command(shim, HoldArg)
	cmd.Stdin, cmd.Dir = r, "/"
	a := &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNET}
	own := ownOnly(uidMap, uint32(os.Geteuid())) && ownOnly(gidMap, uint32(os.Getegid()))
	if own {
		a.UidMappings, a.GidMappings = sysMaps(uidMap), sysMaps(gidMap)
	}
	cmd.SysProcAttr = a
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("start the pod's namespaces: %w", err)
	}
	h := &PodNamespaces{Pid: cmd.Process.Pid, cmd: cmd, stop: w}
	if !own {
		if err := writeMaps(h.Pid, &Spec{UIDMap: uidMap, GIDMap: gidMap}); err != nil {
			h.Close()
			return nil, err
		}
	}
	return h, nil
}

// HoldMain is the holder: it keeps its namespaces until its stdin closes.
func HoldMain() int {
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// EnterPodArgv is argv run inside the pod's user and network namespaces
// (pinned at userns and netns; netns "" keeps the caller's), with a mount
// namespace of its own (private below, so the shim's mounts stay its own)
// and the caller's uid, which is the pod's root there.
func EnterPodArgv(userns, netns string, argv []string) ([]string, error) {
	nsenter, err := lookTool("nsenter")
	if err != nil {
		return nil, err
	}
	unshare, err := lookTool("unshare")
	if err != nil {
		return nil, err
	}
	out := []string{nsenter, "--user=" + userns}
	if netns != "" {
		out = append(out, "--net="+netns)
	}
	out = append(out, "--preserve-credentials", "--", unshare, "--mount", "--propagation", "slave", "--")
	return append(out, argv...), nil
}

// DialIn connects to addr from inside the pod's network namespace
// (pinned at netns, owned by the user namespace pinned at userns): the
// shim binary dials there (DialMain) and hands back the connected socket.
func DialIn(ctx context.Context, shim, userns, netns, network, addr string) (net.Conn, error) {
	nsenter, err := lookTool("nsenter")
	if err != nil {
		return nil, err
	}
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	ours, theirs := sp[0], os.NewFile(uintptr(sp[1]), "dial")
	defer unix.Close(ours)
	cmd := exec.CommandContext(ctx, nsenter, "--user="+userns, "--net="+netns, "--preserve-credentials", "--", shim, DialArg, network, addr)
	cmd.Dir, cmd.ExtraFiles = "/", []*os.File{theirs}
	err = cmd.Start()
	theirs.Close()
	if err != nil {
		return nil, err
	}
	defer cmd.Wait()
	buf := make([]byte, 4096)
	n, fd, err := recvFD(ours, buf)
	if err != nil {
		return nil, fmt.Errorf("dial %s in the pod's network: %w", addr, err)
	}
	if fd >= 0 {
		f := os.NewFile(uintptr(fd), "pod-conn")
		defer f.Close()
		return net.FileConn(f)
	}
	if n == 0 {
		return nil, fmt.Errorf("dial %s in the pod's network: the helper said nothing", addr)
	}
	return nil, errors.New(string(buf[:n]))
}

// DialMain connects (args: network, address) and sends the socket, or
// the error, on descriptor 3.
func DialMain(args []string) int {
	out := 3
	if len(args) != 3 {
		unix.Sendmsg(out, []byte("usage: k3sm-shim dial <network> <address>"), nil, nil, 0)
		return 2
	}
	c, err := net.DialTimeout(args[1], args[2], 10*time.Second)
	if err != nil {
		unix.Sendmsg(out, []byte(err.Error()), nil, nil, 0)
		return 1
	}
	f, err := c.(interface{ File() (*os.File, error) }).File()
	if err != nil {
		unix.Sendmsg(out, []byte(err.Error()), nil, nil, 0)
		return 1
	}
	if err := unix.Sendmsg(out, []byte{0}, unix.UnixRights(int(f.Fd())), nil, 0); err != nil {
		return 1
	}
	return 0
}
