package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/mounts"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Volumes through the contract: files volumes at their mountPath (not on
// the host), an atomic content update, an emptyDir shared by two containers,
// and eviction when an emptyDir passes its sizeLimit.
func TestIntegrationVolumes(t *testing.T) {
	integration(t)
	if !mounts.Namespaced() {
		t.Skip("mount namespaces are not available here (needs root or unprivileged user namespaces)")
	}
	e := newEnv(t)
	target := "/k3sm-it-" + filepath.Base(e.dir) + "/cfg"
	spec := &runtimev1.PodSpec{Uid: "11111111-0000-4000-8000-000000000001", Namespace: "default", Name: "vols",
		RestartPolicy: runtimev1.RestartPolicy_RESTART_POLICY_NEVER,
		Volumes: []*runtimev1.Volume{
			{Name: "cfg", Source: &runtimev1.Volume_Files{Files: &runtimev1.FilesVolume{Files: []*runtimev1.VolumeFile{
				{Path: "greeting", Content: []byte("v1"), Mode: 0o640}}}}},
			{Name: "scratch", Source: &runtimev1.Volume_EmptyDir{EmptyDir: &runtimev1.EmptyDirVolume{SizeLimitBytes: 64 << 10}}},
		},
		Containers: []*runtimev1.ContainerSpec{
			{Name: "writer", Image: "native", Command: []string{"/bin/sh", "-c",
				`cat ` + target + `/greeting; echo; echo hi > /scratch/note; while [ ! -e /scratch/grow ]; do sleep 0.05; done; ` +
					`dd if=/dev/zero of=/scratch/big bs=1024 count=200 2>/dev/null; sleep 600`},
				VolumeMounts: []*runtimev1.VolumeMount{{Name: "cfg", MountPath: target}, {Name: "scratch", MountPath: "/scratch"}}},
			{Name: "reader", Image: "native", Command: []string{"/bin/sh", "-c", `sleep 600`},
				VolumeMounts: []*runtimev1.VolumeMount{{Name: "scratch", MountPath: "/shared"}}},
		}}
	e.create(spec)
	e.waitFor(spec.Uid, "running", 30*time.Second, running)
	if got := e.exec(spec.Uid, "writer", "cat", target+"/greeting"); got != "v1" {
		t.Fatalf("files volume: %q", got)
	}
	if _, err := os.Stat(filepath.Dir(target)); !os.IsNotExist(err) {
		t.Errorf("%s exists on the host (%v)", target, err)
	}
	// The reader container sees what the writer wrote, through exec.
	// Not poll: a note not seen is reported (Errorf) and the test goes on.
	var note string
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end) && note != "hi\n"; time.Sleep(50 * time.Millisecond) {
		note = e.exec(spec.Uid, "reader", "sh", "-c", "cat /shared/note 2>/dev/null; true")
	}
	if note != "hi\n" {
		t.Errorf("emptyDir seen by the other container: %q", note)
	}
	// An update lands atomically and is visible through the mount.
	r, err := e.c.Runtime.UpdatePodVolumes(context.Background(), &runtimev1.UpdatePodVolumesRequest{Uid: spec.Uid,
		Volumes: []*runtimev1.Volume{{Name: "cfg", Source: &runtimev1.Volume_Files{Files: &runtimev1.FilesVolume{Files: []*runtimev1.VolumeFile{
			{Path: "greeting", Content: []byte("v2"), Mode: 0o640}}}}}}})
	if err != nil || len(r.GetChanged()) != 1 {
		t.Fatalf("UpdatePodVolumes: %v %v", r, err)
	}
	if out := e.exec(spec.Uid, "writer", "cat", target+"/greeting"); out != "v2" {
		t.Errorf("after the update: %q", out)
	}
	if out := e.exec(spec.Uid, "writer", "stat", "-L", "-c", "%a", target+"/greeting"); strings.TrimSpace(out) != "640" {
		t.Errorf("mode %q", out)
	}
	// The same content again changes nothing.
	if r, err := e.c.Runtime.UpdatePodVolumes(context.Background(), &runtimev1.UpdatePodVolumesRequest{Uid: spec.Uid,
		Volumes: []*runtimev1.Volume{{Name: "cfg", Source: &runtimev1.Volume_Files{Files: &runtimev1.FilesVolume{Files: []*runtimev1.VolumeFile{
			{Path: "greeting", Content: []byte("v2"), Mode: 0o640}}}}}}}); err != nil || len(r.GetChanged()) != 0 {
		t.Errorf("unchanged update: %v %v", r, err)
	}

	// Passing the sizeLimit evicts the pod: Failed, reason Evicted, every
	// container stopped at once.
	e.exec(spec.Uid, "writer", "touch", "/scratch/grow")
	st := e.waitFor(spec.Uid, "evicted", 30*time.Second, func(st *runtimev1.PodStatus) bool {
		for _, c := range st.GetContainerStatuses() {
			if c.GetState().GetTerminated() == nil {
				return false
			}
		}
		return st.GetPhase() == runtimev1.PodPhase_POD_PHASE_FAILED && st.GetReason() == "Evicted"
	})
	if want := `Usage of EmptyDir volume "scratch" exceeds the limit "64Ki". `; st.GetMessage() != want {
		t.Errorf("message %q, want %q", st.GetMessage(), want)
	}
	if _, err := e.c.Runtime.DeletePod(context.Background(), &runtimev1.DeletePodRequest{Uid: spec.Uid, Wait: true}); err != nil {
		t.Fatal(err)
	}
}

// exec runs a command in a container through the Exec RPC and returns its
// stdout; a non-zero exit fails the test.
func (e *env) exec(uid, container string, command ...string) string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ex, err := e.c.Runtime.Exec(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	ex.Send(&runtimev1.ExecRequest{Msg: &runtimev1.ExecRequest_Start{Start: &runtimev1.ExecStart{PodUid: uid, Container: container, Command: command}}})
	var out, errOut strings.Builder
	var exit *runtimev1.ExitStatus
	for {
		m, err := ex.Recv()
		if err != nil {
			break
		}
		out.Write(m.GetStdout())
		errOut.Write(m.GetStderr())
		if m.GetExit() != nil {
			exit = m.GetExit()
		}
	}
	if exit.GetExitCode() != 0 {
		e.t.Fatalf("exec %v in %s: exit %v, stderr %q", command, container, exit, errOut.String())
	}
	return out.String()
}

// A volume refresh racing a pod's deletion (the node rewrites a token while
// the pod goes) must not leave anything of the pod's directory behind.
func TestIntegrationDeleteDuringVolumeUpdates(t *testing.T) {
	e := newEnv(t)
	for round := range 5 {
		spec := e.podSpec(fmt.Sprintf("refreshed-%d", round), "forever")
		spec.Volumes = []*runtimev1.Volume{{Name: "token", Source: &runtimev1.Volume_Files{Files: &runtimev1.FilesVolume{Files: []*runtimev1.VolumeFile{
			{Path: "token", Content: []byte("0")}}}}}}
		spec.Containers[0].VolumeMounts = []*runtimev1.VolumeMount{{Name: "token", MountPath: "/run/token"}}
		e.create(spec)
		e.waitFor(spec.Uid, "running", 30*time.Second, running)
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := 1; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				e.c.Runtime.UpdatePodVolumes(context.Background(), &runtimev1.UpdatePodVolumesRequest{Uid: spec.Uid,
					Volumes: []*runtimev1.Volume{{Name: "token", Source: &runtimev1.Volume_Files{Files: &runtimev1.FilesVolume{Files: []*runtimev1.VolumeFile{
						{Path: "token", Content: []byte(strconv.Itoa(i))}}}}}}})
			}
		}()
		time.Sleep(20 * time.Millisecond)
		if _, err := e.c.Runtime.DeletePod(context.Background(), &runtimev1.DeletePodRequest{Uid: spec.Uid, Wait: true, GracePeriodSeconds: ptr(int64(0))}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		close(stop)
		<-done
		if _, err := os.Lstat(filepath.Join(e.dir, "pods", spec.Uid)); !os.IsNotExist(err) {
			entries, _ := filepath.Glob(filepath.Join(e.dir, "pods", spec.Uid, "*", "*"))
			t.Fatalf("round %d: the deleted pod's directory is still there (%v): %v", round, err, entries)
		}
		_, err := e.c.Runtime.UpdatePodVolumes(context.Background(), &runtimev1.UpdatePodVolumesRequest{Uid: spec.Uid,
			Volumes: []*runtimev1.Volume{{Name: "token", Source: &runtimev1.Volume_Files{Files: &runtimev1.FilesVolume{}}}}})
		if status.Code(err) != codes.NotFound {
			t.Fatalf("round %d: an update of a deleted pod: %v, want NotFound", round, err)
		}
	}
}
