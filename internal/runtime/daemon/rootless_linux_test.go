package daemon

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
	"golang.org/x/sys/unix"

	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/netd/dataplane"
	netdserver "github.com/k3sm-dev/k3sm/internal/netd/server"
	"github.com/k3sm-dev/k3sm/internal/runtime/imagetest"
	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
)

// The rootless sandbox: a daemon that is not root runs each image pod in
// a user namespace of its own uid (its root), with ids 1…65535 from the
// user's subordinate range when it has one (newuidmap), in the image's
// root, with the same Landlock, seccomp and identity as a root runtime.
// The test runs the daemon as an unprivileged uid of its own choosing; it
// needs root to set that up.

const (
	// Uids no account has; the first is given a subordinate range in
	// /etc/subuid and /etc/subgid for the test's length.
	rootlessRanged   = 64999
	rootlessUnranged = 64998
	rootlessSubStart = 3_000_000_000 // above the root runtime's 2^30…2^31
	rootlessUser     = "k3sm-rootless-test"
)

func TestIntegrationRootlessSandbox(t *testing.T) {
	integration(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root: it runs the daemon as another, unprivileged uid")
	}
	// The unranged uid needs no account: without a name newuidmap is
	// never called.
	imagetest.RootlessAccount(t, rootlessUser, rootlessRanged, rootlessSubStart)

	t.Run("with a subordinate range: the pod's ids", func(t *testing.T) {
		e := newRootlessEnv(t, rootlessRanged)
		spec := e.podSpec("ids", "ids", "ls:/", "read:"+e.dir+"/run/runtimed.lock", "forever")
		spec.Containers[0].SecurityContext = &runtimev1.SecurityContext{RunAsUser: ptr(int64(1000)), RunAsGroup: ptr(int64(2000)),
			SupplementalGroups: []int64{3000}}
		e.create(spec)
		e.waitFor(spec.Uid, "Running", 30*time.Second, running)
		out := e.waitLog(spec.Uid, "denied read:")
		if !strings.Contains(out, "ids uid=1000 gid=2000 groups=[2000 3000]") && !strings.Contains(out, "ids uid=1000 gid=2000 groups=[3000]") {
			t.Errorf("identity in the pod: %q", out)
		}
		// Only the image (and what the sandbox mounts) at "/": no data
		// dir, no host's /home.
		ls := lineWith(out, "ls /:")
		for _, want := range []string{" app", " dev", " proc", " etc"} {
			if !strings.Contains(ls+" ", want+" ") {
				t.Errorf("%q lacks%s", ls, want)
			}
		}
		for _, host := range []string{" usr", " var"} { // the host's, not in the image
			if strings.Contains(ls+" ", host+" ") {
				t.Errorf("%q shows the host's%s", ls, host)
			}
		}
		// On the host the workload runs as the subordinate id of 1000.
		pid := workloadPid(t, e, spec.Uid)
		if uid := procUID(t, pid); uid != rootlessSubStart+999 {
			t.Errorf("the workload runs as host uid %d, want %d (subordinate range start + 999)", uid, rootlessSubStart+999)
		}
		// An exec enters the same boundary, as the same identity.
		got := e.exec(spec.Uid, "main", "prog", "ids", "ls:/proc/1")
		if !strings.Contains(got, "ids uid=1000 gid=2000") {
			t.Errorf("exec: %q", got)
		}
		// The pod's own pid namespace: its workload is pid 1 there.
		if !strings.Contains(e.exec(spec.Uid, "main", "prog", "read:/proc/1/cmdline"), "allowed") {
			t.Errorf("exec cannot see its own pid 1")
		}
		// Seccomp and the user namespace's limits, as with a root runtime.
		if got := e.exec(spec.Uid, "main", "prog", "bpf"); !strings.Contains(got, "denied bpf") {
			t.Errorf("bpf from the pod: %q", got)
		}

		// fsGroup: the emptyDir is the group's (setgid), and what the pod
		// writes there too, as subordinate ids on the host.
		fsg := e.podSpec("fsgroup", "append:/data/f:x", "echo:written", "forever")
		fsg.Volumes = append(fsg.Volumes, &runtimev1.Volume{Name: "data", Source: &runtimev1.Volume_EmptyDir{EmptyDir: &runtimev1.EmptyDirVolume{}}})
		fsg.Containers[0].VolumeMounts = []*runtimev1.VolumeMount{{Name: "data", MountPath: "/data"}}
		fsg.Containers[0].SecurityContext = &runtimev1.SecurityContext{RunAsUser: ptr(int64(1000)), FsGroup: ptr(int64(4000))}
		e.create(fsg)
		e.waitFor(fsg.Uid, "Running", 30*time.Second, running)
		e.waitLog(fsg.Uid, "written\n")
		dir := datadir.New(e.dir).PodVolumeDir(fsg.Uid, "data")
		di, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if g := di.Sys().(*syscall.Stat_t).Gid; g != rootlessSubStart+3999 || di.Mode()&os.ModeSetgid == 0 || di.Mode().Perm() != 0o777 {
			t.Errorf("emptyDir: gid %d mode %v, want %d and setgid 0777", g, di.Mode(), rootlessSubStart+3999)
		}
		fi, err := os.Stat(filepath.Join(dir, "f"))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != rootlessSubStart+999 || st.Gid != rootlessSubStart+3999 {
			t.Errorf("a file the pod wrote: %d:%d, want %d:%d", st.Uid, st.Gid, rootlessSubStart+999, rootlessSubStart+3999)
		}

		// kubectl debug --target: a rootless shim cannot join a user
		// namespace, so the debugger's starts in the target's; its init
		// is born in the target's pid namespace, with its own root.
		target := e.podSpec("debugme", "append:/tmp/secret:in-target-root", "echo:ready", "forever")
		e.create(target)
		e.waitLog(target.Uid, "ready\n")
		e.addEphemeral(target, &runtimev1.EphemeralContainerSpec{TargetContainerName: "main", Container: &runtimev1.ContainerSpec{
			Name: "dbg", Image: e.image, Command: []string{"sh", "-c", `tr '\0' ' ' </proc/1/cmdline; echo; cat /proc/1/root/tmp/secret; [ -e /tmp/secret ] || echo own-root`}}})
		cs := e.waitEphemeralExit(target.Uid, "dbg")
		logs, _ := e.logs(&runtimev1.GetLogsRequest{PodUid: target.Uid, Container: "dbg"})
		if want := "/app/prog append:/tmp/secret:in-target-root echo:ready forever \nin-target-root\nown-root\n"; logs != want || cs.GetState().GetTerminated().GetExitCode() != 0 {
			t.Errorf("rootless debugger: %v\nlog %q\nwant %q", cs.GetState().GetTerminated(), logs, want)
		}
	})

	t.Run("without a range: only the pod's root", func(t *testing.T) {
		e := newRootlessEnv(t, rootlessUnranged)
		root := e.podSpec("root", "ids", "ls:/", "forever")
		e.create(root)
		e.waitFor(root.Uid, "Running", 30*time.Second, running)
		out := e.waitLog(root.Uid, "ls /:")
		if !strings.Contains(out, "ids uid=0 gid=0 groups=[]") {
			t.Errorf("identity in the pod: %q", out)
		}
		if ls := lineWith(out, "ls /:"); strings.Contains(ls+" ", " usr ") || !strings.Contains(ls+" ", " app ") {
			t.Errorf("the pod's / is not its image: %q", ls)
		}
		if uid := procUID(t, workloadPid(t, e, root.Uid)); uid != rootlessUnranged {
			t.Errorf("the workload runs as host uid %d, want the runtime's %d", uid, rootlessUnranged)
		}
		// Exec enters a namespace that denies setgroups (an own-id map).
		if got := e.exec(root.Uid, "main", "prog", "ids", "ls:/"); !strings.Contains(got, "ids uid=0 gid=0") || strings.Contains(got, " usr") {
			t.Errorf("exec: %q", got)
		}
		// image: native keeps the host's view, in the same boundary:
		// Landlock closes /home, its private directory is its own.
		native := &runtimev1.PodSpec{Uid: "native-" + root.Uid[:8], Namespace: "default", Name: "native",
			Containers: []*runtimev1.ContainerSpec{{Name: "sh", Image: "native", Command: []string{"/bin/sh", "-c",
				"echo native in $PWD as $(id -u); ls /home >/dev/null 2>&1 && echo home open || echo home closed; ls /usr/bin/sh && sleep 100"}}}}
		e.create(native)
		e.waitFor(native.Uid, "Running", 30*time.Second, running)
		e.waitLog(native.Uid, "native in /run/k3sm-pod as 0\nhome closed\n/usr/bin/sh\n")

		// A user the namespace cannot give is refused, naming the fix.
		other := e.podSpec("other", "forever")
		other.Containers[0].SecurityContext = &runtimev1.SecurityContext{RunAsUser: ptr(int64(1000))}
		e.create(other)
		st := e.waitFor(other.Uid, "CreateContainerConfigError", 30*time.Second, func(st *runtimev1.PodStatus) bool {
			w := st.GetContainerStatuses()[0].GetState().GetWaiting()
			return w.GetReason() == "CreateContainerConfigError"
		})
		msg := st.GetContainerStatuses()[0].GetState().GetWaiting().GetMessage()
		for _, want := range []string{"1000", "/etc/subuid", "usermod --add-subuids"} {
			if !strings.Contains(msg, want) {
				t.Errorf("refusal %q does not name %q", msg, want)
			}
		}
	})
}

// newRootlessEnv starts a daemon as uid (its own group the same number)
// on a data dir it owns, with this test binary and the shim copied where
// that uid can run them.
func newRootlessEnv(t *testing.T, uid int, env ...string) *env {
	e := newBareEnv(t)
	bin := t.TempDir()
	os.Chmod(bin, 0o755)
	os.Chmod(filepath.Dir(bin), 0o755)
	imagetest.CopyExecutables(t, bin, os.Args[0], shimBin)
	if err := os.Chown(e.dir, uid, uid); err != nil {
		t.Fatal(err)
	}
	os.Chmod(e.dir, 0o755)
	cmd := exec.Command(filepath.Join(bin, filepath.Base(os.Args[0])), "-test.run=^$")
	cmd.Dir = "/"
	cmd.Env = append(os.Environ(), subprocessEnv+"="+e.dir, "K3SM_TEST_SHIM="+filepath.Join(bin, "k3sm-shim"), "HOME=/")
	cmd.Env = append(cmd.Env, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid), NoSetGroups: false}}
	logf, err := os.CreateTemp(t.TempDir(), "daemon-*.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logf
	if testing.Verbose() {
		cmd.Stderr = io.MultiWriter(logf, os.Stderr)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	e.daemonLog, e.daemonExited = logf.Name(), exited
	e.dial()
	t.Cleanup(func() {
		e.deleteAll()
		e.c.Close()
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
		}
		os.RemoveAll(e.dir)
	})
	// The daemon is not root, and says so.
	info, err := e.c.Runtime.GetRuntimeInfo(context.Background(), &runtimev1.GetRuntimeInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.GetCloneMethod() != "overlay" {
		t.Errorf("pod roots by %q, want overlay (the rootless sandbox)", info.GetCloneMethod())
	}
	if fi, err := os.Stat(datadir.New(e.dir).RuntimeSocket()); err != nil || fi.Sys().(*syscall.Stat_t).Uid != uint32(uid) {
		t.Fatalf("the daemon's socket %v, %v: not made by uid %d", fi, err, uid)
	}
	return e
}

func lineWith(out, prefix string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// workloadPid is the host pid of the pod's main container process (the
// shim's shim.json).
func workloadPid(t *testing.T, e *env, uid string) int {
	t.Helper()
	matches, _ := filepath.Glob(filepath.Join(datadir.New(e.dir).PodAttemptsDir(uid), "main", "*"))
	for _, m := range matches {
		if a, err := sandbox.ReadAttempt(m, true); err == nil && a.Pid > 0 {
			return a.Pid
		}
	}
	t.Fatalf("no workload pid for pod %s (%v)", uid, matches)
	return 0
}

// procUID is the real uid of process pid on the host.
func procUID(t *testing.T, pid int) uint32 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "Uid:" {
			n, _ := strconv.ParseUint(f[1], 10, 32)
			return uint32(n)
		}
	}
	t.Fatalf("no Uid in /proc/%d/status", pid)
	return 0
}

// inNetNSEnv marks the run of TestIntegrationRootlessPodNetwork inside the
// network namespace it made for itself.
const inNetNSEnv = "K3SM_TEST_IN_NETNS"

// TestIntegrationRootlessPodNetwork: a runtime that is not root, with a
// k3sm-netd run as root, gives pods their own network: the pod's user
// namespace (of the runtime's) owns its network namespace, which netd
// pins and wires. Two pods listen on the same port at their own
// addresses, one reaches the other with its source address kept, and
// exec and port-forward work inside. It runs in a network namespace of
// its own: netd makes a bridge, routes and nftables tables.
func TestIntegrationRootlessPodNetwork(t *testing.T) {
	integration(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root: netd is root, the runtime another, unprivileged uid")
	}
	if os.Getenv(inNetNSEnv) == "" {
		imagetest.RootlessAccount(t, rootlessUser, rootlessRanged, rootlessSubStart)
		args := []string{"-test.run=^TestIntegrationRootlessPodNetwork$", "-test.count=1"}
		if testing.Verbose() {
			args = append(args, "-test.v")
		}
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = append(os.Environ(), inNetNSEnv+"=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
		out, err := cmd.CombinedOutput()
		if err != nil || testing.Verbose() {
			t.Logf("in a network namespace of its own:\n%s", out)
		}
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("ip link set lo up: %v: %s", err, out)
	}
	netdDir, err := os.MkdirTemp("", "k3sm-netd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(netdDir) })
	os.Chmod(netdDir, 0o755)
	nsDir := filepath.Join(netdDir, "netns")
	netd, err := netdserver.Start(netdserver.Config{Socket: filepath.Join(netdDir, "sock", "netd.sock"), StateFile: filepath.Join(netdDir, "state.json"),
		NetNSDir: nsDir, AllowedUID: rootlessRanged,
		NewDataplane: func() (dataplane.Dataplane, error) { return dataplane.New(dataplane.Options{NetNSDir: nsDir}) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netd.Close() })

	e := newRootlessEnv(t, rootlessRanged, "K3SM_TEST_NETD="+filepath.Join(netdDir, "sock", "netd.sock"))
	ctx := context.Background()
	if _, err := e.c.Runtime.UpdateRuntimeConfig(ctx, &runtimev1.UpdateRuntimeConfigRequest{PodCidr: "100.64.0.0/24"}); err != nil {
		t.Fatal(err)
	}
	ips, uids := map[string]string{}, map[string]string{}
	for _, name := range []string{"a", "b"} {
		spec := e.podSpec(name, "serve:8080", "forever")
		spec.Uid = name + spec.Uid[1:]
		spec.Containers[0].SecurityContext = &runtimev1.SecurityContext{RunAsUser: ptr(int64(1000))}
		e.create(spec)
		st := e.waitFor(spec.Uid, "Running", 30*time.Second, running)
		ips[name], uids[name] = st.GetPodIp(), spec.Uid
		if !strings.HasPrefix(ips[name], "100.64.0.") {
			t.Fatalf("pod %s: IP %q", name, ips[name])
		}
		// netd pinned the pod's namespaces: the runtime's user namespace
		// owns the network one.
		for _, f := range []string{spec.Uid, spec.Uid + ".user"} {
			if ok, _ := isNSFS(filepath.Join(nsDir, f)); !ok {
				t.Errorf("%s is not a pinned namespace", f)
			}
		}
		if uid := procUID(t, workloadPid(t, e, spec.Uid)); uid != rootlessSubStart+999 {
			t.Errorf("pod %s runs as host uid %d", name, uid)
		}
	}
	if ips["a"] == ips["b"] {
		t.Fatalf("both pods have %s", ips["a"])
	}
	// The node reaches both, each answering on its own address. Running
	// means started, not listening yet: refusals are retried for a while.
	for name, ip := range ips {
		var c net.Conn
		poll.Every(t, context.Background(), 10*time.Second, 50*time.Millisecond, fmt.Sprintf("pod %s to answer at %s", name, ip), func() (err error) {
			c, err = net.DialTimeout("tcp", ip+":8080", 5*time.Second)
			return err
		})
		b, _ := io.ReadAll(c)
		c.Close()
		if !strings.Contains(string(b), "to "+ip+":8080") {
			t.Errorf("pod %s answered %q", name, b)
		}
	}
	// Pod b reaches a by its address, and a sees b's (exec in b's sandbox,
	// in b's network).
	uidB := uids["b"]
	got := e.exec(uidB, "main", "prog", "dial:"+ips["a"]+":8080")
	if !strings.Contains(got, "from "+ips["b"]+":") {
		t.Errorf("b dialing a: %q", got)
	}
	t.Logf("pods at %v; b dialing a: %q", ips, got)
	// Port-forward reaches the pod's own loopback, from inside.
	fwd := e.portForward(uidB, 8080, nil)
	if !strings.Contains(fwd, "to 127.0.0.1:8080") {
		t.Errorf("port-forward got %q", fwd)
	}
	t.Logf("port-forward to b: %q", fwd)
	// Deleting the pods releases their namespaces.
	e.deleteAll()
	if left, _ := os.ReadDir(nsDir); len(left) != 0 {
		t.Errorf("namespace files left: %v", left)
	}
}

func isNSFS(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, err
	}
	return st.Type == unix.NSFS_MAGIC, nil
}
