package daemon

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/imagetest"
	"github.com/k3sm-dev/k3sm/internal/runtime/mounts"
	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

func ephStatus(st *runtimev1.PodStatus, name string) *runtimev1.ContainerStatus {
	for _, cs := range st.GetEphemeralContainerStatuses() {
		if cs.GetName() == name {
			return cs
		}
	}
	return nil
}

// Ephemeral containers (kubectl debug) through the contract: an UpdatePod
// that adds one starts it once; it is never restarted whatever its exit
// code and the pod's restartPolicy, takes no part in the phase or
// readiness, keeps its own view of files with a target too (not the
// target's volumes), is re-attached by a restarted daemon, and stops with
// the pod.
func TestIntegrationEphemeralContainers(t *testing.T) {
	integration(t)
	e := newEnv(t)
	namespaced := mounts.Namespaced()
	spec := &runtimev1.PodSpec{Uid: "22222222-0000-4000-8000-000000000001", Namespace: "default", Name: "debugme",
		Volumes: []*runtimev1.Volume{{Name: "scratch", Source: &runtimev1.Volume_EmptyDir{EmptyDir: &runtimev1.EmptyDirVolume{}}}},
		Containers: []*runtimev1.ContainerSpec{{Name: "app", Image: "native", Command: []string{"/bin/sh", "-c", `echo from-app > /scratch/note; sleep 600`},
			VolumeMounts: []*runtimev1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}}}}}
	if !namespaced {
		spec.Containers[0].Command = []string{"/bin/sh", "-c", `sleep 600`}
		spec.Containers[0].VolumeMounts = nil
	}
	e.create(spec)
	e.waitFor(spec.Uid, "running", 30*time.Second, running)

	update := func(ecs ...*runtimev1.EphemeralContainerSpec) {
		t.Helper()
		s := proto.Clone(spec).(*runtimev1.PodSpec)
		s.EphemeralContainers = ecs
		if _, err := e.c.Runtime.UpdatePod(context.Background(), &runtimev1.UpdatePodRequest{Pod: s}); err != nil {
			t.Fatalf("UpdatePod: %v", err)
		}
	}
	// The target's volume is mounted in the target only.
	dbgCmd := `echo debugging; [ -e /scratch ] || echo not-the-target-mounts; exit 3`
	dbg := &runtimev1.EphemeralContainerSpec{TargetContainerName: "app",
		Container: &runtimev1.ContainerSpec{Name: "dbg", Image: "native", Command: []string{"/bin/sh", "-c", dbgCmd}}}
	update(dbg)
	st := e.waitFor(spec.Uid, "the ephemeral container exited", 30*time.Second, func(st *runtimev1.PodStatus) bool {
		return ephStatus(st, "dbg").GetState().GetTerminated() != nil
	})
	cs := ephStatus(st, "dbg")
	if term := cs.GetState().GetTerminated(); term.GetExitCode() != 3 || term.GetReason() != "Error" || cs.GetContainerId() == "" || cs.GetImage() != "native" {
		t.Fatalf("ephemeral status:\n%s", prettyStatus(st))
	}
	if !running(st) || !st.GetContainersReady() || len(st.GetContainerStatuses()) != 1 {
		t.Fatalf("the ephemeral container changed the pod's phase or readiness:\n%s", prettyStatus(st))
	}
	logs, err := e.logs(&runtimev1.GetLogsRequest{PodUid: spec.Uid, Container: "dbg"})
	if want := "debugging\nnot-the-target-mounts\n"; err != nil || logs != want {
		t.Fatalf("ephemeral log %q (%v), want %q (its own view, not the target's mounts)", logs, err, want)
	}
	// Never restarted (the first restart would be immediate).
	time.Sleep(1500 * time.Millisecond)
	if cs := ephStatus(e.status(spec.Uid), "dbg"); cs.GetRestartCount() != 0 || cs.GetState().GetTerminated() == nil {
		t.Fatalf("ephemeral container restarted: %v", cs)
	}

	// A second one from an image, without a target; an update that lists
	// only it keeps the first (ephemeral containers are never removed).
	img := &runtimev1.EphemeralContainerSpec{Container: &runtimev1.ContainerSpec{Name: "img", Image: e.image, Args: []string{"echo:from-image", "exit:0"}}}
	update(img)
	st = e.waitFor(spec.Uid, "the image ephemeral container completed", 30*time.Second, func(st *runtimev1.PodStatus) bool {
		return ephStatus(st, "img").GetState().GetTerminated() != nil
	})
	if cs := ephStatus(st, "img"); cs.GetState().GetTerminated().GetReason() != "Completed" || !strings.Contains(cs.GetImageId(), "@sha256:") {
		t.Fatalf("image ephemeral container:\n%s", prettyStatus(st))
	}
	if n := len(st.GetEphemeralContainerStatuses()); n != 2 || st.GetEphemeralContainerStatuses()[0].GetName() != "dbg" {
		t.Fatalf("want dbg then img:\n%s", prettyStatus(st))
	}
	if l, _ := e.logs(&runtimev1.GetLogsRequest{PodUid: spec.Uid, Container: "img"}); l != "from-image\n" {
		t.Fatalf("image ephemeral log %q", l)
	}

	// A long-running one survives a daemon restart without being restarted.
	sleeper := &runtimev1.EphemeralContainerSpec{TargetContainerName: "app",
		Container: &runtimev1.ContainerSpec{Name: "sleeper", Image: "native", Command: []string{"/bin/sh", "-c", `echo up; sleep 600`}}}
	update(dbg, img, sleeper)
	st = e.waitFor(spec.Uid, "sleeper running", 30*time.Second, func(st *runtimev1.PodStatus) bool {
		return ephStatus(st, "sleeper").GetState().GetRunning() != nil
	})
	before := ephStatus(st, "sleeper")
	if before.GetReady() || !st.GetContainersReady() {
		t.Fatalf("a running ephemeral container is never ready, and does not count:\n%s", prettyStatus(st))
	}
	e.waitLog2(spec.Uid, "sleeper", "up\n")
	e.stop()
	e.startInProcess()
	st = e.waitFor(spec.Uid, "re-attached", 30*time.Second, func(st *runtimev1.PodStatus) bool {
		return ephStatus(st, "sleeper").GetState().GetRunning() != nil
	})
	after := ephStatus(st, "sleeper")
	if after.GetContainerId() != before.GetContainerId() || after.GetRestartCount() != 0 ||
		!after.GetState().GetRunning().GetStartedAt().AsTime().Equal(before.GetState().GetRunning().GetStartedAt().AsTime()) {
		t.Fatalf("after the daemon restart:\n%v\nbefore:\n%v", after, before)
	}
	if cs := ephStatus(st, "dbg"); cs.GetState().GetTerminated().GetExitCode() != 3 {
		t.Fatalf("dbg after the restart: %v", cs)
	}
	if got := e.exec(spec.Uid, "sleeper", "echo", "exec-ok"); got != "exec-ok\n" {
		t.Fatalf("exec in the ephemeral container: %q", got)
	}

	// It stops with the pod.
	zero := int64(0)
	if _, err := e.c.Runtime.DeletePod(context.Background(), &runtimev1.DeletePodRequest{Uid: spec.Uid, GracePeriodSeconds: &zero, Wait: true}); err != nil {
		t.Fatalf("delete: %v", err)
	}
}

// An ephemeral container whose target is not a container of the pod is
// refused.
func TestIntegrationEphemeralBadTarget(t *testing.T) {
	integration(t)
	e := newEnv(t)
	spec := e.podSpec("badtarget", "forever")
	e.create(spec)
	s := proto.Clone(spec).(*runtimev1.PodSpec)
	s.EphemeralContainers = []*runtimev1.EphemeralContainerSpec{{TargetContainerName: "nope",
		Container: &runtimev1.ContainerSpec{Name: "dbg", Image: "native", Command: []string{"/bin/true"}}}}
	_, err := e.c.Runtime.UpdatePod(context.Background(), &runtimev1.UpdatePodRequest{Pod: s})
	if err == nil || !strings.Contains(err.Error(), `target container "nope"`) {
		t.Fatalf("UpdatePod with a bad target: %v", err)
	}
}

// waitLog2 polls a named container's log until it equals want.
func (e *env) waitLog2(uid, container, want string) {
	e.t.Helper()
	poll.UntilNil(e.t, 10*time.Second, fmt.Sprintf("the log of %s/%s to be %q", uid, container, want), func() error {
		if got, _ := e.logs(&runtimev1.GetLogsRequest{PodUid: uid, Container: container}); got != want {
			return fmt.Errorf("log %q", got)
		}
		return nil
	})
}

// debugScript is what a debugger with a shell runs against a target whose
// image has none (test program ops: /tmp/secret in its root, /data/note in
// its emptyDir), with pid the target's process as the debugger sees it:
// its own image as "/", the target's process, the target's files through
// /proc/<pid>/root, its own volume mount (the same emptyDir at /mnt/data)
// and none of the target's.
func debugScript(pid string) string {
	return `[ -x /bin/sh ] && echo own-root-has-a-shell
[ -e /proc/` + pid + `/root/bin/sh ] || echo target-root-has-none
tr '\0' ' ' </proc/` + pid + `/cmdline; echo
cat /proc/` + pid + `/root/tmp/secret /proc/` + pid + `/root/data/note /mnt/data/note
[ -e /data ] || echo not-the-target-mounts`
}

// targetArgs are the target's test program ops debugScript reads, then a
// line the test waits for.
var targetArgs = []string{"append:/tmp/secret:in-target-root", "append:/data/note:in-target-volume", "echo:ready", "forever"}

const wantDebugLog = "own-root-has-a-shell\ntarget-root-has-none\n" +
	"/app/prog append:/tmp/secret:in-target-root append:/data/note:in-target-volume echo:ready forever \n" +
	"in-target-root\nin-target-volume\nin-target-volume\nnot-the-target-mounts\n"

// debugPod is a pod whose container "app" runs targetArgs from image
// (ImageWithoutShell: no shell, no tools) with an emptyDir at /data, and a
// container "done" that exits at once (restartPolicy Never).
func debugPod(e *env, name, image string) *runtimev1.PodSpec {
	spec := e.podSpec(name)
	spec.RestartPolicy = runtimev1.RestartPolicy_RESTART_POLICY_NEVER
	spec.Volumes = []*runtimev1.Volume{{Name: "data", Source: &runtimev1.Volume_EmptyDir{EmptyDir: &runtimev1.EmptyDirVolume{}}}}
	spec.Containers = []*runtimev1.ContainerSpec{
		{Name: "app", Image: image, Args: targetArgs, VolumeMounts: []*runtimev1.VolumeMount{{Name: "data", MountPath: "/data"}}},
		{Name: "done", Image: image, Args: []string{"exit:0"}},
	}
	return spec
}

// debugger is an ephemeral container of the test image (busybox as its
// shell) targeting target, running script, with the pod's emptyDir at
// /mnt/data.
func debugger(e *env, name, target, script string) *runtimev1.EphemeralContainerSpec {
	return &runtimev1.EphemeralContainerSpec{TargetContainerName: target, Container: &runtimev1.ContainerSpec{
		Name: name, Image: e.image, Command: []string{"sh", "-c", script},
		VolumeMounts: []*runtimev1.VolumeMount{{Name: "data", MountPath: "/mnt/data"}}}}
}

// addEphemeral updates the pod with ecs as its ephemeral containers.
func (e *env) addEphemeral(spec *runtimev1.PodSpec, ecs ...*runtimev1.EphemeralContainerSpec) {
	e.t.Helper()
	s := proto.Clone(spec).(*runtimev1.PodSpec)
	s.EphemeralContainers = ecs
	if _, err := e.c.Runtime.UpdatePod(context.Background(), &runtimev1.UpdatePodRequest{Pod: s}); err != nil {
		e.t.Fatalf("UpdatePod: %v", err)
	}
}

// waitEphemeralExit waits for ephemeral container name to terminate.
func (e *env) waitEphemeralExit(uid, name string) *runtimev1.ContainerStatus {
	e.t.Helper()
	st := e.waitFor(uid, name+" terminated", 60*time.Second, func(st *runtimev1.PodStatus) bool {
		return ephStatus(st, name).GetState().GetTerminated() != nil
	})
	return ephStatus(st, name)
}

// kubectl debug --target on a pod whose image has no shell: the debugger
// runs its own image's shell with its own root and volume mounts, in the
// target's user, pid, UTS and IPC namespaces: it sees the target's process
// as pid 1 and reads the target's files through /proc/1/root. An exec into
// it enters the same namespaces. A target that is not running is a
// StartError; an `image: native` debugger sees the target's process but
// keeps its Landlock domain, so /proc/1/root is refused.
func TestIntegrationEphemeralTargetWithoutShell(t *testing.T) {
	integration(t)
	imagetest.RequireBusybox(t)
	e := newEnv(t)
	if !sandbox.Available() {
		t.Skip("no sandbox on this machine: TestIntegrationEphemeralTargetOutsideSandbox covers it")
	}
	img, err := imagetest.ImageWithoutShell(progBin)
	if err != nil {
		t.Fatal(err)
	}
	noShell := e.reg.Push(t, "noshell:v1", img)
	spec := debugPod(e, "noshell", noShell)
	e.create(spec)
	e.waitLog2(spec.Uid, "app", "ready\n")
	_, wait := e.execStream(context.Background(), &runtimev1.ExecStart{PodUid: spec.Uid, Container: "app", Command: []string{"sh", "-c", "true"}})
	if out, exit := wait(); exit.GetExitCode() != 127 {
		t.Fatalf("exec sh in the target: %v %q, want 127 (its image has no shell)", exit, out)
	}

	dbg := debugger(e, "dbg", "app", debugScript("1"))
	e.addEphemeral(spec, dbg)
	cs := e.waitEphemeralExit(spec.Uid, "dbg")
	logs, _ := e.logs(&runtimev1.GetLogsRequest{PodUid: spec.Uid, Container: "dbg"})
	if term := cs.GetState().GetTerminated(); term.GetExitCode() != 0 || logs != wantDebugLog {
		t.Fatalf("debugger: %v\nlog %q\nwant %q", term, logs, wantDebugLog)
	}

	// An exec into a running debugger is in the same namespaces.
	sleeper := debugger(e, "sleeper", "app", "echo up; exec sleep 600")
	e.addEphemeral(spec, dbg, sleeper)
	e.waitLog2(spec.Uid, "sleeper", "up\n")
	if got := e.exec(spec.Uid, "sleeper", "cat", "/proc/1/root/tmp/secret"); got != "in-target-root\n" {
		t.Fatalf("exec in the debugger: %q", got)
	}

	// The target must be running.
	late := debugger(e, "late", "done", "echo ran")
	e.addEphemeral(spec, dbg, sleeper, late)
	cs = e.waitEphemeralExit(spec.Uid, "late")
	if term := cs.GetState().GetTerminated(); term.GetReason() != "StartError" || term.GetExitCode() != 128 ||
		term.GetMessage() != `target container "done" is not running` {
		t.Fatalf("debugger of a target that exited: %v", term)
	}

	// An `image: native` debugger keeps Landlock, which refuses
	// /proc/<pid>/root of a process outside its domain.
	native := &runtimev1.EphemeralContainerSpec{TargetContainerName: "app", Container: &runtimev1.ContainerSpec{
		Name: "native", Image: "native", Command: []string{"/bin/sh", "-c",
			`tr '\0' ' ' </proc/1/cmdline; echo; cat /proc/1/root/tmp/secret 2>/dev/null || echo refused`}}}
	e.addEphemeral(spec, dbg, sleeper, late, native)
	e.waitEphemeralExit(spec.Uid, "native")
	want := "/app/prog append:/tmp/secret:in-target-root append:/data/note:in-target-volume echo:ready forever \nrefused\n"
	if logs, _ := e.logs(&runtimev1.GetLogsRequest{PodUid: spec.Uid, Container: "native"}); logs != want {
		t.Fatalf("native debugger log %q, want %q", logs, want)
	}
	if st := e.status(spec.Uid); !running(st) || st.GetContainerStatuses()[0].GetRestartCount() != 0 {
		t.Fatalf("the target after the debuggers:\n%s", prettyStatus(st))
	}
}

// Without the sandbox there is no pid namespace to join: a debugger with a
// target runs like any container (its own root and volume mounts) and
// sees the target's process as the node does, its files through
// /proc/<pid>/root.
func TestIntegrationEphemeralTargetOutsideSandbox(t *testing.T) {
	integration(t)
	imagetest.RequireBusybox(t)
	e := newEnvWith(t, func(c *Config) { c.DisableSandbox = true })
	img, err := imagetest.ImageWithoutShell(progBin)
	if err != nil {
		t.Fatal(err)
	}
	spec := debugPod(e, "unboxed", e.reg.Push(t, "noshell:v1", img))
	pidFile := filepath.Join(t.TempDir(), "app.pid")
	// Not /tmp/secret: outside the sandbox that is the host's /tmp.
	spec.Containers[0].Args = []string{"pid:" + pidFile, "append:/data/note:in-target-volume", "echo:ready", "forever"}
	e.create(spec)
	e.waitLog2(spec.Uid, "app", "ready\n")
	pid := strconv.Itoa(readPid(t, pidFile))

	script := `tr '\0' ' ' </proc/` + pid + `/cmdline; echo
cat /proc/` + pid + `/root/data/note /mnt/data/note
[ -e /data ] || echo not-the-target-mounts`
	e.addEphemeral(spec, debugger(e, "dbg", "app", script))
	cs := e.waitEphemeralExit(spec.Uid, "dbg")
	logs, _ := e.logs(&runtimev1.GetLogsRequest{PodUid: spec.Uid, Container: "dbg"})
	// The target's command is its path on the host, in its root.
	logs = strings.Replace(logs, filepath.Join(e.dir, "pods", spec.Uid, "roots", "app"), "", 1)
	want := "/app/prog pid:" + pidFile + " append:/data/note:in-target-volume echo:ready forever \n" +
		"in-target-volume\nin-target-volume\nnot-the-target-mounts\n"
	if cs.GetState().GetTerminated().GetExitCode() != 0 || logs != want {
		t.Fatalf("debugger: %v\nlog %q\nwant %q", cs.GetState().GetTerminated(), logs, want)
	}
}
