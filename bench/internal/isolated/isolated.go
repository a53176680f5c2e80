//go:build linux

// Package isolated runs a benchmark program in network and mount
// namespaces of its own, so that the namespaces, links, routes and rules
// it makes never touch the machine's: the program re-executes itself
// under unshare(1) (Reexec), and its inner half checks it did leave the
// machine's namespace (CheckIsolated) before it does anything. It also
// holds the helpers such programs share for working inside a namespace
// from Go (OnThread, LoUp, ListenIn).
package isolated

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Program is one benchmark program, by its short name ("podnet").
type Program string

// dirEnv, set by the outer process, holds the temp dir the inner one
// works in; outerEnv identifies the namespace the outer process ran in,
// which the inner one checks it has left.
func (p Program) dirEnv() string { return "K3SM_BENCH_" + strings.ToUpper(string(p)) + "_DIR" }
func (p Program) outerEnv() string {
	return "K3SM_BENCH_" + strings.ToUpper(string(p)) + "_OUTER_NETNS"
}

// InnerDir is the temp dir of the inner half, or "" in the outer one.
func (p Program) InnerDir() string { return os.Getenv(p.dirEnv()) }

// Reexec runs this program again, with its arguments, in fresh network
// and mount namespaces and a temp dir it removes afterwards; it passes
// SIGINT and SIGTERM on and returns the inner half's exit code.
func (p Program) Reexec() int {
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "bench/%s: %v\n", p, err)
		return 1
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return fail(fmt.Errorf("needs unshare(1) from util-linux: %w", err))
	}
	self, err := os.Executable()
	if err != nil {
		return fail(err)
	}
	outerNS, err := nsID("/proc/self/ns/net")
	if err != nil {
		return fail(err)
	}
	dir, err := os.MkdirTemp("", "k3sm-bench-"+string(p)+"-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(dir)
	// unshare(1) execs the program itself: the child's pid is the inner
	// benchmark's. Private propagation keeps its bind mounts (namespace
	// files) out of the machine's mount table.
	cmd := exec.Command(unshare, append([]string{"--net", "--mount", "--propagation", "private", "--", self}, os.Args[1:]...)...)
	cmd.Env = append(os.Environ(), p.dirEnv()+"="+dir, p.outerEnv()+"="+outerNS)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		return fail(err)
	}
	go func() {
		for s := range sigs {
			cmd.Process.Signal(s)
		}
	}()
	if err := cmd.Wait(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() > 0 {
			return ee.ExitCode()
		}
		return fail(err)
	}
	return 0
}

// CheckIsolated refuses to run in the network namespace the outer process
// ran in (or, where it can be read, that of pid 1): everything the inner
// half does assumes a namespace of its own.
func (p Program) CheckIsolated() error {
	self, err := nsID("/proc/self/ns/net")
	if err != nil {
		return err
	}
	outer := os.Getenv(p.outerEnv())
	if outer == "" {
		return errors.New("the outer process did not say which namespace it ran in (" + p.outerEnv() + ")")
	}
	init, _ := nsID("/proc/1/ns/net") // not readable in every container
	if self == outer || self == init {
		return errors.New("refusing to run in the machine's network namespace (run the program without " + p.dirEnv() + ")")
	}
	return nil
}

// nsID identifies a namespace by the device and inode of its file.
func nsID(path string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino), nil
}

// OnThread runs fn on an OS thread switched into the network namespace at
// nsPath: a socket, a TUN link and a netlink socket belong to the
// namespace of the thread that creates them, and keep it whatever thread
// later uses them. If the thread cannot be switched back it stays locked,
// and the runtime discards it with its goroutine.
func OnThread(nsPath string, fn func() error) error {
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
			errc <- errors.Join(ferr, fmt.Errorf("leave %s: %w", nsPath, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// ListenIn listens on addr (TCP, IPv4) inside the namespace at nsPath.
func ListenIn(nsPath, addr string) (net.Listener, error) {
	var ln net.Listener
	err := OnThread(nsPath, func() (err error) {
		ln, err = net.Listen("tcp4", addr)
		return err
	})
	return ln, err
}

// HandleAt is a netlink handle inside the namespace at nsPath.
func HandleAt(nsPath string) (*netlink.Handle, error) {
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	return netlink.NewHandleAt(ns)
}

// LoUp brings lo up in the namespace at nsPath (a fresh namespace has it
// down).
func LoUp(nsPath string) error {
	h, err := HandleAt(nsPath)
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
