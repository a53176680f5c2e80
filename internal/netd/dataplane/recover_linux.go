package dataplane

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// recoverNetNS pins again the live network namespace of a pod whose pin is
// no longer mounted here, and reports whether it did. A pin is a bind
// mount, so it lives in netd's mount namespace: when netd runs in one of
// its own (`ip netns exec`, a unit with PrivateMounts= or ProtectSystem=,
// a container) the pins vanish with it while the pod's processes keep
// running in their namespaces. The pod's veth still joins such a
// namespace to the bridge, so the host end, named after the pod, says
// which namespace is the pod's (its peer's namespace id), and any process
// still inside it gives a path to pin it from. Nothing is recovered when
// the host end is gone or no process is left in the namespace: after a
// reboot, or when every container has exited, a new namespace is right.
func (d *linuxPlane) recoverNetNS(h *netlink.Handle, p Pod) (bool, error) {
	host, err := h.LinkByName(p.HostIf)
	if err != nil || host.Type() != "veth" || host.Attrs().NetNsID < 0 {
		return false, nil
	}
	fd, pid, err := findNetNS(h, host.Attrs().NetNsID)
	if err != nil || fd < 0 {
		return false, err
	}
	defer unix.Close(fd)
	if p.UserNS != "" {
		// The pod's namespaces are its runtime's: the user namespace that
		// owns the network namespace is pinned too, after the checks
		// adoptNetNS makes of a runtime's namespaces.
		owner, err := unix.IoctlRetInt(fd, unix.NS_GET_USERNS)
		if err != nil {
			return false, fmt.Errorf("dataplane: the owner of process %d's network namespace: %w", pid, err)
		}
		defer unix.Close(owner)
		if err := checkRuntimeUserNS(owner, p.Owner); err != nil {
			return false, fmt.Errorf("dataplane: pod %s: process %d: %w", p.UID, pid, err)
		}
		if err := pinNS(owner, p.UserNS); err != nil {
			return false, err
		}
	}
	if err := pinNS(fd, p.NetNS); err != nil {
		if p.UserNS != "" {
			removeNetNS(p.UserNS)
		}
		return false, err
	}
	return true, nil
}

// findNetNS returns an open descriptor of the network namespace that has
// id nsid in h's namespace, from the first process found in it, or -1
// when no process is in it.
func findNetNS(h *netlink.Handle, nsid int) (fd, pid int, err error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return -1, 0, fmt.Errorf("dataplane: %w", err)
	}
	seen := map[string]bool{} // namespaces already asked about, by "net:[inode]"
	self := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		path := "/proc/" + e.Name() + "/ns/net"
		link, err := os.Readlink(path)
		if err != nil || seen[link] {
			continue // gone meanwhile, or a kernel thread
		}
		seen[link] = true
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		if id, err := h.GetNetNsIdByFd(fd); err == nil && id == nsid {
			return fd, pid, nil
		}
		unix.Close(fd)
	}
	return -1, 0, nil
}

// checkRuntimeUserNS checks that the user namespace open on fd is not
// netd's own and belongs to uid owner (an unprivileged runtime's).
func checkRuntimeUserNS(fd, owner int) error {
	if owner <= 0 {
		return fmt.Errorf("a pod brings its own namespaces only from an unprivileged runtime, not uid %d", owner)
	}
	var got, self unix.Stat_t
	if err := errors.Join(unix.Fstat(fd, &got), unix.Stat("/proc/self/ns/user", &self)); err != nil {
		return err
	}
	if got.Dev == self.Dev && got.Ino == self.Ino {
		return errors.New("its user namespace is the host's user namespace, not one of the runtime's")
	}
	uid, err := unix.IoctlGetUint32(fd, unix.NS_GET_OWNER_UID)
	if err != nil {
		return fmt.Errorf("the owner of its user namespace: %w", err)
	}
	if int(uid) != owner {
		return fmt.Errorf("its user namespace belongs to uid %d, not the runtime's %d", uid, owner)
	}
	return nil
}

// pinNS bind-mounts the namespace open on fd on path, an empty 0400 file
// made if missing, in a directory that exists.
func pinNS(fd int, path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o400)
	if err != nil {
		return fmt.Errorf("dataplane: %w", err)
	}
	f.Close()
	if err := unix.Mount(fmt.Sprintf("/proc/self/fd/%d", fd), path, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("dataplane: pin a namespace on %s: %w", path, err)
	}
	return nil
}
