//go:build linux

package main

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"

	"github.com/k3sm-dev/k3sm/bench/internal/isolated"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// createNS makes a fresh network namespace and bind-mounts it on path (in
// this process's private mount namespace), with lo up.
func createNS(path string) error {
	if err := os.WriteFile(path, nil, 0o400); err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		own, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer own.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("unshare a network namespace: %w", err)
			return
		}
		merr := unix.Mount(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), path, "", unix.MS_BIND, "")
		if merr != nil {
			merr = fmt.Errorf("bind-mount a network namespace on %s: %w", path, merr)
		}
		if err := unix.Setns(int(own.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(merr, fmt.Errorf("back to the process's namespace: %w", err))
			return // the thread stays locked and dies with this goroutine
		}
		runtime.UnlockOSThread()
		errc <- merr
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return err
	}
	return isolated.LoUp(path)
}

// removeNS unmounts and removes a namespace file createNS made (the
// namespace, its links and routes go with its last reference).
func removeNS(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// wanName is the underlay link between two "machines" (node namespaces).
const wanName = "wan0"

// joinByVeth plugs the namespaces at nsA and nsB together by a veth pair,
// wanName on each side, with addresses a and b in one subnet of len bits.
func joinByVeth(nsA, nsB string, a, b netip.Addr, bits int) error {
	hA, err := isolated.HandleAt(nsA)
	if err != nil {
		return err
	}
	defer hA.Close()
	nsBh, err := netns.GetFromPath(nsB)
	if err != nil {
		return err
	}
	defer nsBh.Close()
	la := netlink.NewLinkAttrs()
	la.Name = wanName
	if err := hA.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: wanName, PeerNamespace: netlink.NsFd(nsBh)}); err != nil {
		return fmt.Errorf("veth %s between the namespaces: %w", wanName, err)
	}
	for _, side := range []struct {
		ns   string
		addr netip.Addr
	}{{nsA, a}, {nsB, b}} {
		if err := addrUp(side.ns, wanName, netip.PrefixFrom(side.addr, bits)); err != nil {
			return err
		}
	}
	return nil
}

// addrUp gives link name in the namespace at nsPath the address p and
// brings it up.
func addrUp(nsPath, name string, p netip.Prefix) error {
	h, err := isolated.HandleAt(nsPath)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	ipnet := &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
	if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipnet}); err != nil {
		return fmt.Errorf("address %v on %s: %w", p, name, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("%s up: %w", name, err)
	}
	return nil
}
