package daemon

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
)

func TestRunRefusesBadConfig(t *testing.T) {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "k3sm")
	defer os.RemoveAll(dir)
	exe, _ := os.Executable()
	open := filepath.Join(dir, "open")
	os.Mkdir(open, 0o755)
	os.Chmod(open, 0o755)
	notSock := filepath.Join(dir, "priv", "file")
	os.Mkdir(filepath.Dir(notSock), 0o700)
	os.WriteFile(notSock, []byte("data"), 0o600)
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "Config.DataDir is required"},
		{Config{DataDir: dir, ShimPath: filepath.Join(dir, "nope")}, "Config.ShimPath"},
		{Config{DataDir: dir, ShimPath: exe, Socket: filepath.Join(open, "rt.sock")}, "must be private (0700)"},
		{Config{DataDir: dir, ShimPath: exe, Socket: notSock}, "is not a socket"},
		{Config{DataDir: dir, ShimPath: exe, Socket: "/tmp/" + strings.Repeat("x", 120)}, "Config.Socket"},
	} {
		err := Run(ctx, c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c.cfg, err, c.want)
		}
	}
	if b, _ := os.ReadFile(notSock); string(b) != "data" {
		t.Error("a file in the socket's place was replaced")
	}
}

// Without Config.ShimPath the shim is the k3sm-shim beside the executable,
// else one on $PATH; with neither, the error names the file beside the
// executable and the make target that builds it.
func TestFindShimDefault(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(exe), "k3sm-shim")); err == nil {
		t.Skip("a k3sm-shim is beside the test binary")
	}
	pathDir := t.TempDir()
	t.Setenv("PATH", pathDir)
	_, err = findShim("")
	beside := filepath.Join(filepath.Dir(exe), "k3sm-shim")
	if err == nil || !strings.Contains(err.Error(), beside+" not found") || !strings.Contains(err.Error(), "make bin/k3sm-shim") {
		t.Errorf("no shim anywhere: err %v, want one naming %s and make bin/k3sm-shim", err, beside)
	}
	onPath := filepath.Join(pathDir, "k3sm-shim")
	if err := os.WriteFile(onPath, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := findShim(""); err != nil || got != onPath {
		t.Errorf("findShim with k3sm-shim on $PATH = %q, %v; want %q", got, err, onPath)
	}
}

func TestIntegrationOneDaemonPerDataDirAndValidation(t *testing.T) {
	e := newEnv(t)
	cfg := testConfig(e.dir)
	cfg.ShimPath = shimBin
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The second daemon waits for the lock (a killed predecessor may still
	// be exiting) as long as its context lets it.
	rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
	defer rcancel()
	if err := Run(rctx, cfg); err == nil || !strings.Contains(err.Error(), "already serves data dir") {
		t.Errorf("second daemon on the same data dir: %v", err)
	}
	for _, spec := range []*runtimev1.PodSpec{
		{Uid: "", Namespace: "d", Name: "x", Containers: []*runtimev1.ContainerSpec{{Name: "c", Image: "native"}}},
		{Uid: "../escape", Namespace: "d", Name: "x", Containers: []*runtimev1.ContainerSpec{{Name: "c", Image: "native"}}},
		{Uid: "u1", Namespace: "d", Name: "x"},
		{Uid: "u2", Namespace: "d", Name: "x", Containers: []*runtimev1.ContainerSpec{{Name: "c"}}},
		{Uid: "u3", Namespace: "d", Name: "x", Containers: []*runtimev1.ContainerSpec{{Name: "c", Image: "native"}, {Name: "c", Image: "native"}}},
	} {
		_, err := e.c.Runtime.CreatePod(ctx, &runtimev1.CreatePodRequest{Pod: spec})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("create %v: %v, want InvalidArgument", spec, err)
		}
	}
	if _, err := e.c.Runtime.GetPodStatus(ctx, &runtimev1.GetPodStatusRequest{Uid: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("status of unknown pod: %v", err)
	}
	if _, err := e.c.Runtime.DeletePod(ctx, &runtimev1.DeletePodRequest{Uid: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("delete of unknown pod: %v", err)
	}
}

func TestIntegrationUpdatePodRestartsChangedContainer(t *testing.T) {
	e := newEnv(t)
	w := e.watch()
	spec := e.podSpec("updated", "echo:version 1", "forever")
	spec.TerminationGracePeriodSeconds = ptr(int64(1))
	e.create(spec)
	e.waitFor(spec.Uid, "Running", 30*time.Second, running)
	e.waitLog(spec.Uid, "version 1\n")
	// Creating again is idempotent.
	if _, err := e.c.Runtime.CreatePod(context.Background(), &runtimev1.CreatePodRequest{Pod: spec}); err != nil {
		t.Fatal(err)
	}
	spec.Containers[0].Args = []string{"echo:version 2", "forever"}
	if _, err := e.c.Runtime.UpdatePod(context.Background(), &runtimev1.UpdatePodRequest{Pod: spec}); err != nil {
		t.Fatal(err)
	}
	st := e.waitFor(spec.Uid, "restarted with the new definition", 30*time.Second, func(st *runtimev1.PodStatus) bool {
		return running(st) && ctrState(st).GetRestartCount() == 1
	})
	if ctrState(st).GetLastTerminationState().GetTerminated() == nil {
		t.Errorf("no last termination: %s", prettyStatus(st))
	}
	e.waitLog(spec.Uid, "version 2\n")
	w.waitFor(t, spec.Uid, "Killing", "definition changed")

	// The watch reports the deletion.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := e.c.Runtime.WatchPodStatus(ctx, &runtimev1.WatchPodStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	initial := 0
	for {
		m, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if m.GetKind() == runtimev1.WatchPodStatusResponse_KIND_INITIAL {
			initial++
		}
		if m.GetKind() == runtimev1.WatchPodStatusResponse_KIND_SYNCED {
			break
		}
	}
	if initial != 1 {
		t.Errorf("%d INITIAL messages, want 1", initial)
	}
	zero := int64(0)
	e.c.Runtime.DeletePod(ctx, &runtimev1.DeletePodRequest{Uid: spec.Uid, GracePeriodSeconds: &zero})
	sawTerminating := false
	for {
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("watch ended before DELETED: %v", err)
		}
		if m.GetKind() == runtimev1.WatchPodStatusResponse_KIND_UPDATED && m.GetStatus().GetTerminating() {
			sawTerminating = true
		}
		if m.GetKind() == runtimev1.WatchPodStatusResponse_KIND_DELETED {
			if m.GetStatus().GetUid() != spec.Uid || ctrState(m.GetStatus()).GetState().GetTerminated() == nil {
				t.Errorf("DELETED carries %s", prettyStatus(m.GetStatus()))
			}
			break
		}
	}
	if !sawTerminating {
		t.Error("no UPDATED message with terminating set")
	}
}

func TestIntegrationUpdateFixesImage(t *testing.T) {
	e := newEnv(t)
	spec := e.podSpec("fix-image", "echo:fixed", "forever")
	good := spec.Containers[0].Image
	spec.Containers[0].Image = e.reg.Host + "/typo:v1"
	e.create(spec)
	e.waitFor(spec.Uid, "ImagePullBackOff", 20*time.Second, func(st *runtimev1.PodStatus) bool {
		return ctrState(st).GetState().GetWaiting().GetReason() == "ImagePullBackOff"
	})
	spec.Containers[0].Image = good
	if _, err := e.c.Runtime.UpdatePod(context.Background(), &runtimev1.UpdatePodRequest{Pod: spec}); err != nil {
		t.Fatal(err)
	}
	st := e.waitFor(spec.Uid, "Running with the fixed image", 20*time.Second, running)
	if cs := ctrState(st); cs.GetRestartCount() != 0 || cs.GetImage() != good {
		t.Errorf("after the fix: %s", prettyStatus(st))
	}
	e.waitLog(spec.Uid, "fixed\n")
	renamed := proto.Clone(spec).(*runtimev1.PodSpec)
	renamed.Name = "other"
	if _, err := e.c.Runtime.UpdatePod(context.Background(), &runtimev1.UpdatePodRequest{Pod: renamed}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("renaming a pod: %v", err)
	}
}

// TestIntegrationUpdatePodRestartsOnlyOnHashChange: with definition_hash, an
// update that only changes the resolved env (a relabelled pod, a changed
// ConfigMap) leaves the container running as it is, exec included, and the
// new env is what the next start gets; a new hash restarts it once.
func TestIntegrationUpdatePodRestartsOnlyOnHashChange(t *testing.T) {
	e := newEnv(t)
	spec := e.podSpec("hashed", "env:L", "forever")
	spec.TerminationGracePeriodSeconds = ptr(int64(1))
	c := spec.Containers[0]
	c.DefinitionHash = "h1"
	c.Env = []*runtimev1.EnvVar{{Name: "L", Value: "one", Verbatim: true}}
	e.create(spec)
	st := e.waitFor(spec.Uid, "Running", 30*time.Second, running)
	id := ctrState(st).GetContainerId()
	e.waitLog(spec.Uid, "L=one\n")

	c.Env = []*runtimev1.EnvVar{{Name: "L", Value: "two", Verbatim: true}}
	if _, err := e.c.Runtime.UpdatePod(context.Background(), &runtimev1.UpdatePodRequest{Pod: spec}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	st = e.status(spec.Uid)
	if !running(st) || ctrState(st).GetRestartCount() != 0 || ctrState(st).GetContainerId() != id {
		t.Fatalf("an env-only update restarted the container: %s", prettyStatus(st))
	}
	// Exec runs with the env the process has.
	if out := e.exec(spec.Uid, "", "/app/prog", "env:L"); out != "L=one\n" {
		t.Errorf("exec after an env-only update: %q, want the running attempt's L=one", out)
	}

	c.DefinitionHash = "h2"
	if _, err := e.c.Runtime.UpdatePod(context.Background(), &runtimev1.UpdatePodRequest{Pod: spec}); err != nil {
		t.Fatal(err)
	}
	e.waitFor(spec.Uid, "restarted for the new hash", 30*time.Second, func(st *runtimev1.PodStatus) bool {
		return running(st) && ctrState(st).GetRestartCount() == 1
	})
	e.waitLog(spec.Uid, "L=two\n")
	if out := e.exec(spec.Uid, "", "/app/prog", "env:L"); out != "L=two\n" {
		t.Errorf("exec after the restart: %q, want L=two", out)
	}
	time.Sleep(2 * time.Second)
	if n := ctrState(e.status(spec.Uid)).GetRestartCount(); n != 1 {
		t.Fatalf("restartCount %d after one hash change, want 1", n)
	}
}
