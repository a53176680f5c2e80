package daemon

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/mounts"
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
// readiness, runs in its target's mount namespace (seeing the target's
// volumes), is re-attached by a restarted daemon, and stops with the pod.
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
	dbgCmd := `echo debugging; exit 3`
	if namespaced {
		dbgCmd = `cat /scratch/note; exit 3`
	}
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
	if want := map[bool]string{true: "from-app\n", false: "debugging\n"}[namespaced]; err != nil || logs != want {
		t.Fatalf("ephemeral log %q (%v), want %q (the target's volume)", logs, err, want)
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
	var got string
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if got, _ = e.logs(&runtimev1.GetLogsRequest{PodUid: uid, Container: container}); got == want {
			return
		}
	}
	e.t.Fatalf("log of %s/%s: %q, want %q", uid, container, got, want)
}
