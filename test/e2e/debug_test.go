package e2e

import (
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/k3sm-dev/k3sm/internal/runtime/imagetest"
)

// ephemeralStatus returns the pod's status of ephemeral container name.
func ephemeralStatus(p *corev1.Pod, name string) *corev1.ContainerStatus {
	for i := range p.Status.EphemeralContainerStatuses {
		if p.Status.EphemeralContainerStatuses[i].Name == name {
			return &p.Status.EphemeralContainerStatuses[i]
		}
	}
	return nil
}

// TestKubectlDebug runs `kubectl debug` against a running pod: the
// ephemeral container starts (once), shares the target container's pid
// namespace so it reads the target's volume through /proc/1/root, and
// reports its output, exit code and events; `kubectl debug -i` attaches to
// its stdin, `-it` to its terminal.
func TestKubectlDebug(t *testing.T) {
	imgs := buildImages(t)
	s := newServer(t)
	s.start()
	c := s.client()
	s.deletePodsAtCleanup(t)

	// The target writes into an emptyDir that only its own mount namespace
	// shows at /data; the debugger reaches it through the target's root.
	web := nativePod("web", imgs.prog, "append:/data/note:written-by-target", "forever")
	web.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	web.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	s.createPod(t, web)
	waitPod(t, c, "web", 2*time.Minute, running)

	t.Run("non-interactive with --target", func(t *testing.T) {
		out, err := s.kubectl("debug", "web", "--image="+imgs.prog, "--target=main", "-c", "debugger", "--",
			"sh", "-c", "echo debugger-ran; cat /proc/1/root/data/note; exit 3")
		if err != nil {
			t.Fatalf("kubectl debug: %v\n%s", err, out)
		}
		pod := waitPod(t, c, "web", 2*time.Minute, func(p *corev1.Pod) error {
			cs := ephemeralStatus(p, "debugger")
			if cs == nil || cs.State.Terminated == nil {
				return fmt.Errorf("ephemeral statuses %+v", p.Status.EphemeralContainerStatuses)
			}
			return nil
		})
		cs := ephemeralStatus(pod, "debugger")
		if term := cs.State.Terminated; term.ExitCode != 3 || term.Reason != "Error" || cs.ContainerID == "" ||
			cs.Image != imgs.prog || !strings.Contains(cs.ImageID, "@sha256:") {
			t.Fatalf("ephemeral status %+v", cs)
		}
		logs, err := s.kubectl("logs", "web", "-c", "debugger")
		if err != nil || logs != "debugger-ran\nwritten-by-target\n" {
			t.Fatalf("kubectl logs -c debugger: %v %q (want the target's /data/note through /proc/1/root)", err, logs)
		}
		// The pod is unaffected: still Running and Ready, nothing restarted.
		time.Sleep(2 * time.Second)
		pod, err = c.CoreV1().Pods("default").Get(ctx(t), "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pod.Status.Phase != corev1.PodRunning || pod.Status.ContainerStatuses[0].RestartCount != 0 || !pod.Status.ContainerStatuses[0].Ready {
			t.Fatalf("pod after debug: %s %+v", pod.Status.Phase, pod.Status.ContainerStatuses)
		}
		if cs := ephemeralStatus(pod, "debugger"); cs.RestartCount != 0 || cs.State.Terminated == nil {
			t.Fatalf("the ephemeral container was restarted: %+v", cs)
		}
		// Events as for any container.
		waitFor(t, 30*time.Second, "events of the ephemeral container", func() error {
			evs, err := c.CoreV1().Events("default").List(ctx(t), metav1.ListOptions{FieldSelector: fields.Set{
				"involvedObject.name": "web", "involvedObject.fieldPath": "spec.ephemeralContainers{debugger}"}.String()})
			if err != nil {
				return err
			}
			seen := map[string]bool{}
			for _, e := range evs.Items {
				seen[e.Reason] = true
			}
			for _, r := range []string{"Pulled", "Created", "Started"} {
				if !seen[r] {
					return fmt.Errorf("no %s event; have %v", r, seen)
				}
			}
			return nil
		})
	})

	t.Run("interactive -i", func(t *testing.T) {
		cmd := s.kubectlCmd("debug", "-i", "web", "--image="+imgs.prog, "--target=main", "-c", "interactive", "--",
			"sh", "-c", `read line; echo "got:$line"; cat /proc/1/root/data/note`)
		cmd.Stdin = strings.NewReader("typed-in\n")
		out := &outBuf{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("kubectl debug -i: %v\n%s", err, out.String())
			}
		case <-time.After(3 * time.Minute):
			cmd.Process.Kill()
			t.Fatalf("kubectl debug -i did not end; output %q", out.String())
		}
		if !strings.Contains(out.String(), "got:typed-in\nwritten-by-target\n") {
			t.Fatalf("kubectl debug -i output %q", out.String())
		}
		pod := waitPod(t, c, "web", time.Minute, func(p *corev1.Pod) error {
			if cs := ephemeralStatus(p, "interactive"); cs == nil || cs.State.Terminated == nil {
				return fmt.Errorf("ephemeral statuses %+v", p.Status.EphemeralContainerStatuses)
			}
			return nil
		})
		if cs := ephemeralStatus(pod, "interactive"); cs.State.Terminated.ExitCode != 0 || cs.State.Terminated.Reason != "Completed" {
			t.Fatalf("interactive ephemeral status %+v", cs)
		}
		if n := len(pod.Status.EphemeralContainerStatuses); n != 2 {
			t.Fatalf("%d ephemeral statuses, want 2: %+v", n, pod.Status.EphemeralContainerStatuses)
		}
	})

	t.Run("interactive -it through a pty", func(t *testing.T) {
		cmd := s.kubectlCmd("debug", "-it", "web", "--image="+imgs.prog, "--target=main", "-c", "term", "--", "sh")
		cmd.Env = append(os.Environ(), "TERM=xterm")
		term, out, done := startInPty(t, cmd, 24, 80)
		out.waitFor(t, "If you don't see a command prompt", 2*time.Minute)
		io.WriteString(term, "test -t 0 && echo IS-$((6*7))-TTY; cat /proc/1/root/data/note; exit 4\r")
		out.waitFor(t, "IS-42-TTY", 30*time.Second)
		out.waitFor(t, "written-by-target", 10*time.Second)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("kubectl debug -it did not end after exit; output %q", out.String())
		}
		waitPod(t, c, "web", time.Minute, func(p *corev1.Pod) error {
			if cs := ephemeralStatus(p, "term"); cs == nil || cs.State.Terminated == nil || cs.State.Terminated.ExitCode != 4 {
				return fmt.Errorf("ephemeral statuses %+v", p.Status.EphemeralContainerStatuses)
			}
			return nil
		})
	})
}

// TestKubectlDebugTargetWithoutShell is issue 37's case: `kubectl debug
// --target` with a busybox image on a pod whose image has no shell. The
// debugger runs busybox's shell from its own image as "/", sees the
// target's process as pid 1 of the namespace it shares, and reads the
// target's files (its root and its emptyDir) through /proc/1/root; its
// own view has none of the target's mounts.
func TestKubectlDebugTargetWithoutShell(t *testing.T) {
	imagetest.RequireBusybox(t)
	bin, err := imagetest.BuildProg(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	reg := imagetest.StartRegistry(t, "", "")
	push := func(ref string, build func() (v1.Image, error)) string {
		img, err := build()
		if err != nil {
			t.Fatal(err)
		}
		return reg.Push(t, ref, img)
	}
	noShell := push("noshell:v1", func() (v1.Image, error) { return imagetest.ImageWithoutShell(bin) })
	busybox := push("busybox:v1", func() (v1.Image, error) { return imagetest.Image(bin, v1.Platform{}) })
	s := newServer(t)
	s.start()
	c := s.client()
	s.deletePodsAtCleanup(t)

	pod := nativePod("distroless", noShell, "append:/tmp/secret:in-target-root", "append:/data/note:in-target-volume", "echo:ready", "forever")
	pod.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	s.createPod(t, pod)
	waitPod(t, c, "distroless", 2*time.Minute, running)
	waitFor(t, time.Minute, "the target's files", func() error {
		if out, _ := s.kubectl("logs", "distroless"); out != "ready\n" {
			return fmt.Errorf("log %q", out)
		}
		return nil
	})
	if out, err := s.kubectl("exec", "distroless", "--", "sh", "-c", "true"); err == nil {
		t.Fatalf("the target's image has a shell: %s", out)
	}

	out, err := s.kubectl("debug", "distroless", "--image="+busybox, "--target=main", "-c", "debugger", "--", "sh", "-c",
		`[ -x /bin/sh ] && echo own-root-has-a-shell
[ -e /proc/1/root/bin/sh ] || echo target-root-has-none
ps -o pid,args | grep -v grep | grep '/app/prog append'
cat /proc/1/root/tmp/secret /proc/1/root/data/note
[ -e /data ] || echo not-the-target-mounts`)
	if err != nil {
		t.Fatalf("kubectl debug: %v\n%s", err, out)
	}
	got := waitPod(t, c, "distroless", 2*time.Minute, func(p *corev1.Pod) error {
		if cs := ephemeralStatus(p, "debugger"); cs == nil || cs.State.Terminated == nil {
			return fmt.Errorf("ephemeral statuses %+v", p.Status.EphemeralContainerStatuses)
		}
		return nil
	})
	logs, err := s.kubectl("logs", "distroless", "-c", "debugger")
	want := "own-root-has-a-shell\ntarget-root-has-none\n" +
		"    1 /app/prog append:/tmp/secret:in-target-root append:/data/note:in-target-volume echo:ready forever\n" +
		"in-target-root\nin-target-volume\nnot-the-target-mounts\n"
	if cs := ephemeralStatus(got, "debugger"); err != nil || logs != want || cs.State.Terminated.ExitCode != 0 {
		t.Fatalf("debugger: %+v\nlog %q (%v)\nwant %q", cs.State.Terminated, logs, err, want)
	}
	if st := got.Status.ContainerStatuses[0]; got.Status.Phase != corev1.PodRunning || st.RestartCount != 0 || st.State.Running == nil {
		t.Fatalf("the target after kubectl debug: %s %+v", got.Status.Phase, st)
	}
}
