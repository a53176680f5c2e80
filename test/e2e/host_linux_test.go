package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"syscall"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// What the tests do to and read of the Linux host: network namespaces,
// mounts and the node's nftables tables (host_other_test.go has the same
// names elsewhere, where the tests that use them skip).

// inNetNS runs f on a thread of its own in the network namespace at
// nsPath. Sockets f opens stay in that namespace.
func inNetNS(nsPath string, f func() error) error {
	ch := make(chan error, 1)
	go func() {
		// Never unlocked: the thread, left in the other namespace, ends
		// with this goroutine.
		runtime.LockOSThread()
		ns, err := os.Open(nsPath)
		if err != nil {
			ch <- err
			return
		}
		defer ns.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- fmt.Errorf("setns %s: %w", nsPath, err)
			return
		}
		ch <- f()
	}()
	return <-ch
}

// unmountDetach lazily unmounts path, ignoring errors.
func unmountDetach(path string) { syscall.Unmount(path, syscall.MNT_DETACH) }

// servicesTable is the node's table ip k3sm-services.
var servicesTable = &nftables.Table{Family: nftables.TableFamilyIPv4, Name: "k3sm-services"}

// servicesMapHas reports (nil) whether a map of the node's table ip
// k3sm-services has a key with the address ip.
func servicesMapHas(name string, ip netip.Addr) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	set, err := c.GetSetByName(servicesTable, name)
	if err != nil {
		return fmt.Errorf("map %s of table ip k3sm-services: %w", name, err)
	}
	els, err := c.GetSetElements(set)
	if err != nil {
		return err
	}
	a := ip.As4()
	for _, e := range els {
		if len(e.Key) >= 4 && [4]byte(e.Key[:4]) == a {
			return nil
		}
	}
	return fmt.Errorf("map %s has no element for %s (%d elements)", name, ip, len(els))
}

// servicesChainExists reports (nil) whether the node's table ip
// k3sm-services has the chain.
func servicesChainExists(chain string) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	if _, err := c.ListChain(servicesTable, chain); err != nil {
		return fmt.Errorf("chain %s of table ip k3sm-services: %w", chain, err)
	}
	return nil
}
