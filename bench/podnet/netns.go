//go:build linux

package main

import (
	"fmt"
	"net"
	"os"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// inNS runs fn on an OS thread switched into the network namespace at
// nsPath: a socket belongs to the namespace of the thread that creates it,
// and keeps it whatever thread later reads it. If the thread cannot be
// switched back it stays locked, and the runtime discards it with its
// goroutine.
func inNS(nsPath string, fn func() error) error {
	target, err := os.Open(nsPath)
	if err != nil {
		return fmt.Errorf("network namespace: %w", err)
	}
	defer target.Close()
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
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter %s: %w", nsPath, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(own.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- ferr
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// listenIn listens on addr inside the namespace at nsPath.
func listenIn(nsPath, addr string) (net.Listener, error) {
	var ln net.Listener
	err := inNS(nsPath, func() (err error) {
		ln, err = net.Listen("tcp4", addr)
		return err
	})
	return ln, err
}

// loUp brings lo up in the namespace at nsPath (a fresh namespace has it
// down; a real host has it up).
func loUp(nsPath string) error {
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	return h.LinkSetUp(lo)
}
