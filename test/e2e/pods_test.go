package e2e

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/k3sm-dev/k3sm/internal/runtime/imagetest"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

// images are test images built from a Go program and served from a real
// registry on 127.0.0.1.
type images struct {
	prog, foreign, missing string
}

// progImage is the test program's image for this machine's platform.
func progImage(t *testing.T) v1.Image {
	t.Helper()
	bin, err := imagetest.BuildProg(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	img, err := imagetest.Image(bin, v1.Platform{})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// variant is img with its config file changed by edit.
func variant(t *testing.T, img v1.Image, edit func(*v1.ConfigFile)) v1.Image {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	edit(cf)
	out, err := mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func buildImages(t *testing.T) images {
	t.Helper()
	bin, err := imagetest.BuildProg(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	reg := imagetest.StartRegistry(t, "", "")
	host, err := imagetest.Image(bin, v1.Platform{})
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := imagetest.Image(bin, imagetest.ForeignPlatform())
	if err != nil {
		t.Fatal(err)
	}
	return images{
		prog:    reg.Push(t, "prog:v1", host),
		foreign: reg.Push(t, "prog:foreign", foreign),
		missing: reg.Host + "/does-not-exist:v1",
	}
}

// nativePod is a pod that selects this node's OS and tolerates the provider
// taint: neither is needed on linux (TestStandardManifests), both are harmless.
func nativePod(name, image string, args ...string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"test": name}},
		Spec:       nativeSpec(image, args...),
	}
}

func nativeSpec(image string, args ...string) corev1.PodSpec {
	return corev1.PodSpec{
		NodeSelector: map[string]string{"kubernetes.io/os": "linux"},
		Tolerations:  []corev1.Toleration{{Key: "k3sm.io/provider", Operator: corev1.TolerationOpExists}},
		Containers:   []corev1.Container{{Name: "main", Image: image, Args: args}},
	}
}

func waitPod(t *testing.T, c kubernetes.Interface, name string, timeout time.Duration, cond func(*corev1.Pod) error) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	waitFor(t, timeout, "pod "+name, func() error {
		p, err := c.CoreV1().Pods("default").Get(ctx(t), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		pod = p
		return cond(p)
	})
	return pod
}

func running(p *corev1.Pod) error {
	if p.Status.Phase != corev1.PodRunning {
		return fmt.Errorf("phase %s: %+v", p.Status.Phase, p.Status.ContainerStatuses)
	}
	return nil
}

// workloadPids are the main processes of this server's image pods.
func (s *server) workloadPids() []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		// A workload is the child of its container's shim, which runs
		// with the attempt's state dir under this server's data dir (a
		// sandboxed workload's own executable path is inside its image).
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(f) < 2 {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", f[1], "cmdline"))
		args := strings.Split(string(cmdline), "\x00")
		if len(args) >= 2 && strings.HasSuffix(args[0], "k3sm-shim") && strings.HasPrefix(args[1], filepath.Join(s.dataDir, "pods")+"/") {
			// Image pods only (an image root), as before the sandbox:
			// `image: native` commands are the host's programs.
			if cfg, err := os.ReadFile(filepath.Join(args[1], "config.json")); err == nil && strings.Contains(string(cfg), `"lower":`) {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

func waitGone(t *testing.T, c kubernetes.Interface, name string, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	waitFor(t, timeout, "pod "+name+" gone", func() error {
		_, err := c.CoreV1().Pods("default").Get(ctx(t), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%v)", err)
	})
	return time.Since(start)
}

func TestNodeRunsPods(t *testing.T) {
	imgs := buildImages(t)
	s := newServer(t)
	s.start()
	c := s.client()

	t.Run("node registered", func(t *testing.T) {
		n, err := c.CoreV1().Nodes().Get(ctx(t), "e2e-node", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n.Labels["kubernetes.io/os"] != "linux" || n.Labels["kubernetes.io/hostname"] != "e2e-node" || n.Labels["kubernetes.io/arch"] == "" {
			t.Fatalf("labels %v", n.Labels)
		}
		// The provider taint is opt-in on linux (--node-taint; TestStandardManifests).
		for _, taint := range n.Spec.Taints {
			if taint.Key == "k3sm.io/provider" {
				t.Fatalf("taints %v: the provider taint is opt-in on linux", n.Spec.Taints)
			}
		}
		if n.Status.Capacity.Cpu().IsZero() || n.Status.Capacity.Memory().IsZero() || n.Status.Capacity.Pods().IsZero() {
			t.Fatalf("capacity %v", n.Status.Capacity)
		}
		// The node's own credential is a kubelet's, constrained by the Node authorizer.
		kc := readFile(t, filepath.Join(s.dataDir, "agent", "node.kubeconfig"))
		if strings.Contains(kc, "system:masters") {
			t.Fatal("node kubeconfig carries an admin identity")
		}
		waitFor(t, 30*time.Second, "node lease", func() error {
			_, err := c.CoordinationV1().Leases("kube-node-lease").Get(ctx(t), "e2e-node", metav1.GetOptions{})
			return err
		})
	})

	t.Run("deployment runs, logs, scales to 20 and back to 0", func(t *testing.T) {
		labels := map[string]string{"app": "prog"}
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "prog"}, Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: nativeSpec(imgs.prog)},
		}}
		if _, err := c.AppsV1().Deployments("default").Create(ctx(t), d, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		scaleAndWait := func(n int32) {
			t.Helper()
			setScale(t, c, "prog", n)
			waitFor(t, 2*time.Minute, fmt.Sprintf("%d pods Running", n), func() error {
				pods, err := c.CoreV1().Pods("default").List(ctx(t), metav1.ListOptions{LabelSelector: "app=prog"})
				if err != nil {
					return err
				}
				ready := 0
				for _, p := range pods.Items {
					if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
						ready++
					}
				}
				if ready != int(n) || len(pods.Items) != int(n) {
					return fmt.Errorf("%d pods, %d running", len(pods.Items), ready)
				}
				if procs := len(s.workloadPids()); procs != int(n) {
					return fmt.Errorf("%d workload processes", procs)
				}
				return nil
			})
		}
		scaleAndWait(1)
		pods, _ := c.CoreV1().Pods("default").List(ctx(t), metav1.ListOptions{LabelSelector: "app=prog"})
		p := pods.Items[0]
		cs := p.Status.ContainerStatuses[0]
		if !strings.Contains(cs.ImageID, "@sha256:") || cs.ContainerID == "" || !cs.Ready {
			t.Fatalf("container status %+v", cs)
		}
		waitFor(t, 30*time.Second, "logs", func() error {
			out, err := s.kubectl("logs", p.Name)
			if err != nil || !strings.Contains(out, "hello from k3sm") {
				return fmt.Errorf("%v: %s", err, out)
			}
			return nil
		})
		out, err := s.kubectl("logs", p.Name, "--timestamps", "--tail=1", "-c", "main")
		if err != nil || !strings.Contains(out, "hello from k3sm") || !strings.Contains(out, "Z ") {
			t.Fatalf("logs --timestamps: %v %s", err, out)
		}
		scaleAndWait(20)
		scaleAndWait(0)
		if left := s.workloadPids(); len(left) != 0 {
			t.Fatalf("processes left behind: %v", left)
		}
		entries, _ := os.ReadDir(filepath.Join(s.dataDir, "pods"))
		waitFor(t, 30*time.Second, "pod directories removed", func() error {
			entries, _ = os.ReadDir(filepath.Join(s.dataDir, "pods"))
			if len(entries) != 0 {
				return fmt.Errorf("%d pod dirs left", len(entries))
			}
			return nil
		})
	})

	t.Run("crash loop backs off and keeps the previous log", func(t *testing.T) {
		if _, err := c.CoreV1().Pods("default").Create(ctx(t), nativePod("crasher", imgs.prog, "echo:attempt", "exit:3"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var restarts []time.Time
		sawBackOff := false
		last := int32(0)
		waitFor(t, 2*time.Minute, "three restarts of crasher", func() error {
			p, err := c.CoreV1().Pods("default").Get(ctx(t), "crasher", metav1.GetOptions{})
			if err == nil && len(p.Status.ContainerStatuses) == 1 {
				cs := p.Status.ContainerStatuses[0]
				if cs.State.Waiting != nil && cs.State.Waiting.Reason == "CrashLoopBackOff" {
					sawBackOff = true
				}
				if cs.RestartCount > last {
					last = cs.RestartCount
					restarts = append(restarts, time.Now())
				}
			}
			if last < 3 {
				return fmt.Errorf("restartCount %d, saw CrashLoopBackOff %v", last, sawBackOff)
			}
			return nil
		})
		if !sawBackOff {
			t.Fatalf("restartCount %d, saw CrashLoopBackOff %v", last, sawBackOff)
		}
		// As the kubelet: the first restart is immediate, then 10s, 20s, ...
		first, second := restarts[1].Sub(restarts[0]), restarts[2].Sub(restarts[1])
		if first < 8*time.Second || second < first*3/2 {
			t.Fatalf("back-offs %s then %s; want 10s doubling", first, second)
		}
		out, err := s.kubectl("logs", "crasher", "--previous")
		if err != nil || !strings.Contains(out, "attempt") {
			t.Fatalf("logs --previous: %v %s", err, out)
		}
		p, _ := c.CoreV1().Pods("default").Get(ctx(t), "crasher", metav1.GetOptions{})
		if lt := p.Status.ContainerStatuses[0].LastTerminationState.Terminated; lt == nil || lt.ExitCode != 3 || lt.Reason != "Error" {
			t.Fatalf("lastTerminationState %+v", p.Status.ContainerStatuses[0].LastTerminationState)
		}
		events, _ := c.CoreV1().Events("default").List(ctx(t), metav1.ListOptions{FieldSelector: "involvedObject.name=crasher"})
		reasons := map[string]bool{}
		for _, e := range events.Items {
			reasons[e.Reason] = true
		}
		for _, r := range []string{"Pulled", "Created", "Started", "BackOff"} {
			if !reasons[r] {
				t.Fatalf("no %s event among %v", r, reasons)
			}
		}
	})

	t.Run("job completes", func(t *testing.T) {
		job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "once"}, Spec: batchv1.JobSpec{
			Template: corev1.PodTemplateSpec{Spec: nativeSpec(imgs.prog, "echo:done")}}}
		job.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyNever
		if _, err := c.BatchV1().Jobs("default").Create(ctx(t), job, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 2*time.Minute, "job Complete", func() error {
			j, err := c.BatchV1().Jobs("default").Get(ctx(t), "once", metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, cond := range j.Status.Conditions {
				if cond.Type == batchv1.JobComplete && cond.Status == corev1.ConditionTrue {
					return nil
				}
			}
			return fmt.Errorf("conditions %v", j.Status.Conditions)
		})
	})

	t.Run("init containers run first, in order", func(t *testing.T) {
		p := nativePod("inits", imgs.prog, "echo:main")
		p.Spec.InitContainers = []corev1.Container{
			{Name: "first", Image: imgs.prog, Args: []string{"sleep:500ms", "echo:one"}},
			{Name: "second", Image: imgs.prog, Args: []string{"echo:two"}},
		}
		p.Spec.RestartPolicy = corev1.RestartPolicyNever
		if _, err := c.CoreV1().Pods("default").Create(ctx(t), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p = waitPod(t, c, "inits", time.Minute, func(p *corev1.Pod) error {
			if p.Status.Phase != corev1.PodSucceeded {
				return fmt.Errorf("phase %s", p.Status.Phase)
			}
			return nil
		})
		first := p.Status.InitContainerStatuses[0].State.Terminated
		second := p.Status.InitContainerStatuses[1].State.Terminated
		main := p.Status.ContainerStatuses[0].State.Terminated
		if first == nil || second == nil || main == nil || first.Reason != "Completed" {
			t.Fatalf("statuses %+v %+v", p.Status.InitContainerStatuses, p.Status.ContainerStatuses)
		}
		if second.StartedAt.Before(&first.FinishedAt) || main.StartedAt.Before(&second.FinishedAt) {
			t.Fatalf("out of order: first %v-%v second %v-%v main %v", first.StartedAt, first.FinishedAt, second.StartedAt, second.FinishedAt, main.StartedAt)
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodInitialized && cond.Status != corev1.ConditionTrue {
				t.Fatalf("Initialized = %s", cond.Status)
			}
		}
	})

	t.Run("SIGTERM and the grace period", func(t *testing.T) {
		marker := filepath.Join(t.TempDir(), "sigterm")
		trap := nativePod("trap", imgs.prog, "trapfile:"+marker+":2s", "forever")
		stubborn := nativePod("stubborn", imgs.prog, "ignore", "forever")
		stubborn.Spec.TerminationGracePeriodSeconds = ptr.To[int64](3)
		for _, p := range []*corev1.Pod{trap, stubborn} {
			shareScratch(t, &p.Spec) // the marker file
			if _, err := c.CoreV1().Pods("default").Create(ctx(t), p, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			waitPod(t, c, p.Name, time.Minute, running)
		}
		time.Sleep(300 * time.Millisecond) // let the programs install their handlers
		if err := c.CoreV1().Pods("default").Delete(ctx(t), "trap", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		took := waitGone(t, c, "trap", time.Minute)
		if got := readFile(t, marker); !strings.Contains(got, "got SIGTERM") {
			t.Fatalf("SIGTERM not delivered: %q", got)
		}
		if took < 1500*time.Millisecond || took > 20*time.Second {
			t.Fatalf("a pod that exits 2s after SIGTERM was gone after %s", took)
		}
		if err := c.CoreV1().Pods("default").Delete(ctx(t), "stubborn", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		took = waitGone(t, c, "stubborn", time.Minute)
		if took < 2500*time.Millisecond || took > 20*time.Second {
			t.Fatalf("a pod ignoring SIGTERM with grace 3s was gone after %s", took)
		}
	})

	t.Run("image errors use the kubelet's reasons", func(t *testing.T) {
		for _, tc := range []struct{ name, image, want, msg string }{
			{"foreign", imgs.foreign, "ErrImagePull", "platform"},
			{"missing", imgs.missing, "ErrImagePull", ""},
			{"badname", "UPPER/Case:bad tag", "InvalidImageName", ""},
		} {
			if _, err := c.CoreV1().Pods("default").Create(ctx(t), nativePod(tc.name, tc.image), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			seen := map[string]string{}
			waitPod(t, c, tc.name, time.Minute, func(p *corev1.Pod) error {
				if len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Waiting != nil {
					w := p.Status.ContainerStatuses[0].State.Waiting
					seen[w.Reason] = w.Message
				}
				if m, ok := seen[tc.want]; ok && strings.Contains(m, tc.msg) {
					return nil
				}
				return fmt.Errorf("waiting reasons so far %v", seen)
			})
		}
		waitPod(t, c, "missing", time.Minute, func(p *corev1.Pod) error {
			if w := p.Status.ContainerStatuses[0].State.Waiting; w == nil || w.Reason != "ImagePullBackOff" {
				return fmt.Errorf("state %+v", p.Status.ContainerStatuses[0].State)
			}
			return nil
		})
	})
}

// TestPodsSurviveRestarts: kill -9 of the runtime daemon and of the whole
// server leaves pods running; they are re-attached, not restarted.
func TestPodsSurviveRestarts(t *testing.T) {
	imgs := buildImages(t)
	s := newServer(t)
	s.start()
	c := s.client()
	if _, err := c.CoreV1().Pods("default").Create(ctx(t), nativePod("survivor", imgs.prog), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, c, "survivor", time.Minute, running)
	pids := s.workloadPids()
	if len(pids) != 1 {
		t.Fatalf("workload processes %v", pids)
	}
	check := func(what string) {
		t.Helper()
		if syscall.Kill(pids[0], 0) != nil {
			t.Fatalf("workload died with the %s", what)
		}
		p := waitPod(t, c, "survivor", 2*time.Minute, func(p *corev1.Pod) error {
			if err := running(p); err != nil {
				return err
			}
			events, err := c.CoreV1().Events("default").List(ctx(t), metav1.ListOptions{FieldSelector: "involvedObject.name=survivor,reason=PodReattached"})
			if err != nil || len(events.Items) == 0 {
				return fmt.Errorf("no PodReattached event yet (%v)", err)
			}
			return nil
		})
		if rc := p.Status.ContainerStatuses[0].RestartCount; rc != 0 {
			t.Fatalf("restartCount %d after the %s restart", rc, what)
		}
		if now := s.workloadPids(); len(now) != 1 || now[0] != pids[0] {
			t.Fatalf("workload processes %v, want the same %v", now, pids)
		}
		out, err := s.kubectl("logs", "survivor")
		if err != nil || !strings.Contains(out, "hello from k3sm") {
			t.Fatalf("logs after re-attach: %v %s", err, out)
		}
	}

	rt := s.childPids("runtimed")
	if len(rt) != 1 {
		t.Fatalf("runtimed children %v", rt)
	}
	syscall.Kill(rt[0], syscall.SIGKILL)
	waitFor(t, time.Minute, "runtimed restarted", func() error {
		if now := s.childPids("runtimed"); len(now) != 1 || now[0] == rt[0] {
			return fmt.Errorf("runtimed %v", now)
		}
		return nil
	})
	check("runtime daemon")

	_ = c.CoreV1().Events("default").DeleteCollection(ctx(t), metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: "reason=PodReattached"})
	s.cmd.Process.Kill()
	<-s.waitErr
	waitFor(t, 30*time.Second, "server children gone", func() error {
		for _, role := range []string{"kube-apiserver", "runtimed", "node", "kube-controllers"} {
			if len(s.childPids(role)) != 0 {
				return fmt.Errorf("%s still running", role)
			}
		}
		// An exiting process can still hold its listener for a moment.
		for _, port := range s.ports {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				return err
			}
			l.Close()
		}
		return nil
	})
	s.cmd = nil
	s.start()
	check("server")
}

// setScale sets a Deployment's replicas, retrying when the controller
// changed it between the read and the write.
func setScale(t *testing.T, c kubernetes.Interface, name string, n int32) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		sc, err := c.AppsV1().Deployments("default").GetScale(ctx(t), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		sc.Spec.Replicas = n
		_, err = c.AppsV1().Deployments("default").UpdateScale(ctx(t), name, sc, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
