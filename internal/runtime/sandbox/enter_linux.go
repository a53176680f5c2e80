//go:build linux

package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// Arguments of the shim binary's two exec hops.
const (
	EnterArg = "enter"
	ExecArg  = "exec"
)

// EnterArgv returns the command line that runs argv in the sandbox of the
// container whose shim state is attemptDir (its config.json and
// shim.json), in directory dir as the container sees it: exec, exec probes
// and exec hooks of a sandboxed container all run through it. The shim
// binary (shim) first joins the container's cgroups on the host (EnterMain),
// then nsenter enters the container's namespaces and runs the shim binary
// again from inside (ExecMain), which applies the container's identity,
// capabilities, Landlock domain and seccomp filter and execs argv. The
// caller sets the environment.
func EnterArgv(shim, attemptDir, dir string, argv []string) []string {
	return append([]string{shim, EnterArg, attemptDir, dir, "--"}, argv...)
}

// execConfig is what EnterMain hands ExecMain, in a memfd.
type execConfig struct {
	Spec *Spec  `json:"spec"`
	Dir  string `json:"dir"`
}

// EnterMain is the first exec hop, on the host: args are EnterArgv's
// after the binary.
func EnterMain(args []string) int {
	if len(args) < 5 || args[3] != "--" {
		fmt.Fprintln(os.Stderr, "usage: k3sm-shim enter <attempt-dir> <dir> -- <command>...")
		return 126
	}
	attemptDir, dir, argv := args[1], args[2], args[4:]
	att, err := ReadAttempt(attemptDir, true)
	if err != nil {
		fmt.Fprintln(os.Stderr, "k3sm: the container is not running:", err)
		return 126
	}
	if att.Sandbox == nil || att.Pid <= 0 {
		fmt.Fprintln(os.Stderr, "k3sm: the container has no sandbox to enter")
		return 126
	}
	if err := JoinCgroups(att.Cgroups, 0); err != nil {
		fmt.Fprintln(os.Stderr, "k3sm:", err)
		return 126
	}
	exe, err := unix.Open("/proc/self/exe", unix.O_RDONLY, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "k3sm:", err)
		return 126
	}
	// Raw descriptor calls: an *os.File's finalizer could close it
	// before the exec below.
	mfd, err := unix.MemfdCreate("k3sm-exec", 0)
	if err == nil {
		b, _ := json.Marshal(execConfig{Spec: att.Sandbox, Dir: dir})
		if _, err = unix.Write(mfd, b); err == nil {
			_, err = unix.Seek(mfd, 0, io.SeekStart)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "k3sm:", err)
		return 126
	}
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		fmt.Fprintln(os.Stderr, "k3sm: nsenter (from util-linux) is needed to enter a container:", err)
		return 126
	}
	pid := strconv.Itoa(att.Pid)
	nsArgv := []string{"nsenter", "--target", pid, "--mount", "--pid", "--uts", "--ipc"}
	// The node's own network (a rootless runtime's pods) is ours
	// already, and a user namespace's root may not enter it again.
	if theirs, err := os.Readlink("/proc/" + pid + "/ns/net"); err != nil {
		fmt.Fprintln(os.Stderr, "k3sm: the container is not running:", err)
		return 126
	} else if ours, _ := os.Readlink("/proc/self/ns/net"); theirs != ours {
		nsArgv = append(nsArgv, "--net")
	}
	// The container's user namespace: its own, or its pod's (a shim in
	// the pod's namespaces).
	if theirs, err := os.Readlink("/proc/" + pid + "/ns/user"); err != nil {
		fmt.Fprintln(os.Stderr, "k3sm: the container is not running:", err)
		return 126
	} else if ours, _ := os.Readlink("/proc/self/ns/user"); theirs != ours {
		nsArgv = append(nsArgv, "--user")
		if Rootless() {
			// Our uid is the namespace's root already; nsenter's switch to
			// 0 would call setgroups, which an own-id map denies.
			nsArgv = append(nsArgv, "--preserve-credentials")
		}
	}
	nsArgv = append(nsArgv, "--", fdPath(exe), ExecArg, strconv.Itoa(exe), strconv.Itoa(mfd), "--")
	err = unix.Exec(nsenter, append(nsArgv, argv...), os.Environ())
	fmt.Fprintln(os.Stderr, "k3sm: exec nsenter:", err)
	return 126
}

// ExecMain is the second exec hop, inside the container's namespaces and
// root: it applies the container's boundary and execs the command.
func ExecMain(args []string) int {
	runtime.LockOSThread()
	if len(args) < 5 || args[3] != "--" {
		fmt.Fprintln(os.Stderr, "usage: k3sm-shim exec <exe-fd> <config-fd> -- <command>...")
		return 126
	}
	exeFD, err1 := strconv.Atoi(args[1])
	cfgFD, err2 := strconv.Atoi(args[2])
	if err := errors.Join(err1, err2); err != nil {
		fmt.Fprintln(os.Stderr, "k3sm:", err)
		return 126
	}
	unix.Close(exeFD)
	f := os.NewFile(uintptr(cfgFD), "exec")
	var cfg execConfig
	err := json.NewDecoder(f).Decode(&cfg)
	f.Close()
	if err == nil && cfg.Spec == nil {
		err = errors.New("no sandbox")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "k3sm: exec config:", err)
		return 126
	}
	err = finish(cfg.Spec, args[4:], os.Environ(), cfg.Dir)
	fmt.Fprintln(os.Stderr, "k3sm:", err)
	if errors.Is(err, errNotFound) {
		return 127
	}
	return 126
}
