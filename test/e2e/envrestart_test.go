package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/imagetest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// TestEnvValuesAndRestarts covers issue 9: env values from Secrets,
// ConfigMaps and the downward API reach the process byte for byte (only
// literal values, command and args are $(VAR)-expanded, as the kubelet
// does), and a running container restarts only when its API definition
// changes (a new image), not when what the node resolves for it changes (a
// label behind a fieldRef, a referenced ConfigMap).
func TestEnvValuesAndRestarts(t *testing.T) {
	reg := imagetest.StartRegistry(t, "", "")
	img1 := progImage(t)
	img2 := variant(t, img1, func(cf *v1.ConfigFile) { cf.Config.Env = append(cf.Config.Env, "IMAGE_VERSION=two") })
	ref1, ref2 := reg.Push(t, "prog:one", img1), reg.Push(t, "prog:two", img2)

	s := newServer(t)
	s.start()
	c := s.client()
	cx := ctx(t)

	t.Run("secret and configMap values are not expanded", func(t *testing.T) {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "verbatim"},
			StringData: map[string]string{"pw": "pa$$w0rd", "home": "$(HOME)x", "other": "$(A)"}}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "verbatim"}, Data: map[string]string{"ref": "$(A)", "B": "b$$"}}
		if _, err := c.CoreV1().Secrets("default").Create(cx, sec, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.CoreV1().ConfigMaps("default").Create(cx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p := nativePod("verbatim", ref1, "env:PW", "env:HOMEX", "env:OTHER", "env:CMREF", "env:CM_B", "env:S_pw",
			"env:LIT", "env:CHAIN", "echo:arg=$(A)/$$(A)/$(CM_B)", "echo:done", "forever")
		ctr := &p.Spec.Containers[0]
		ctr.Command = []string{"/app/prog", "echo:cmd=$(PW)"}
		ctr.EnvFrom = []corev1.EnvFromSource{
			{Prefix: "CM_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "verbatim"}}},
			{Prefix: "S_", SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "verbatim"}}},
		}
		secretKey := func(k string) *corev1.EnvVarSource {
			return &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "verbatim"}, Key: k}}
		}
		ctr.Env = []corev1.EnvVar{
			{Name: "A", Value: "alpha"},
			{Name: "PW", ValueFrom: secretKey("pw")},
			{Name: "HOMEX", ValueFrom: secretKey("home")},
			{Name: "OTHER", ValueFrom: secretKey("other")},
			{Name: "CMREF", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "verbatim"}, Key: "ref"}}},
			{Name: "LIT", Value: "$(A)-$$"},
			{Name: "CHAIN", Value: "$(PW)|$(CM_B)|$(UNSET)"},
		}
		if _, err := c.CoreV1().Pods("default").Create(cx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPod(t, c, "verbatim", 2*time.Minute, running)
		var out string
		waitFor(t, 30*time.Second, "output", func() error {
			var err error
			out, err = s.kubectl("logs", "verbatim")
			if err != nil || !strings.Contains(out, "done\n") {
				return fmt.Errorf("%v: %s", err, out)
			}
			return nil
		})
		want := []string{
			"cmd=pa$$w0rd", // command: $(PW) expands to the secret, which is not expanded again
			"PW=pa$$w0rd", "HOMEX=$(HOME)x", "OTHER=$(A)", "CMREF=$(A)", "CM_B=b$$", "S_pw=pa$$w0rd",
			"LIT=alpha-$",                 // a literal value expands as the kubelet does
			"CHAIN=pa$$w0rd|b$$|$(UNSET)", // references insert final values; unknown ones stay
			"arg=alpha/$(A)/b$$",          // args expand, $$ escapes
		}
		for _, w := range want {
			if !strings.Contains("\n"+out, "\n"+w+"\n") {
				t.Errorf("want line %q in:\n%s", w, out)
			}
		}
	})

	t.Run("label and ConfigMap changes do not restart, a new image does", func(t *testing.T) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "restart-cm"}, Data: map[string]string{"k": "first"}}
		if _, err := c.CoreV1().ConfigMaps("default").Create(cx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pidFile := filepath.Join(t.TempDir(), "pid")
		p := nativePod("restarts", ref1, "pid:"+pidFile, "env:LBL", "env:K", "env:IMAGE_VERSION", "echo:started", "forever")
		p.Labels["v"] = "1"
		p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](2)
		p.Spec.Containers[0].Env = []corev1.EnvVar{
			{Name: "LBL", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['v']"}}},
			{Name: "K", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "restart-cm"}, Key: "k"}}},
		}
		shareScratch(t, &p.Spec) // the pid file
		if _, err := c.CoreV1().Pods("default").Create(cx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPod(t, c, "restarts", 2*time.Minute, running)
		waitLogs(t, s, "restarts", "LBL=1\nK=first\nIMAGE_VERSION=\n")

		// current waits for a running attempt and returns its restart
		// count and pid.
		current := func() (int32, int) {
			t.Helper()
			var restarts int32
			waitPod(t, c, "restarts", time.Minute, func(p *corev1.Pod) error {
				if err := running(p); err != nil {
					return err
				}
				restarts = p.Status.ContainerStatuses[0].RestartCount
				return nil
			})
			return restarts, readPid(t, pidFile)
		}
		// unchanged checks, for a while after the node passed an update on
		// to the runtime, that the attempt running before still runs. Each
		// step is judged on its own: a failure is reported, and the next
		// step starts from whatever runs then.
		unchanged := func(what string, before int, change func()) {
			t.Helper()
			restarts, pid := current()
			change()
			waitFor(t, time.Minute, what+": node passed the update on", func() error {
				if n := providerUpdates(t, c, "restarts"); n <= before {
					return fmt.Errorf("%d ProviderUpdateSuccess events, want more than %d", n, before)
				}
				return nil
			})
			// Not poll: this checks that nothing changes for 10 s.
			for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
				pod, err := c.CoreV1().Pods("default").Get(cx, "restarts", metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if st := pod.Status.ContainerStatuses; len(st) != 1 || st[0].RestartCount != restarts || st[0].State.Running == nil {
					t.Errorf("%s restarted the container (restartCount was %d): %+v", what, restarts, st)
					return
				}
				if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
					t.Errorf("%s: process %d is gone", what, pid)
					return
				}
				if got := readPid(t, pidFile); got != pid {
					t.Errorf("%s: pid %d, want %d", what, got, pid)
					return
				}
			}
		}

		unchanged("kubectl label", providerUpdates(t, c, "restarts"), func() {
			if out, err := s.kubectl("label", "pod", "restarts", "v=2", "--overwrite"); err != nil {
				t.Fatalf("kubectl label: %v: %s", err, out)
			}
		})
		// Exec runs with the env the process has (the new value is for the
		// container's next start).
		if out, err := s.kubectl("exec", "restarts", "--", "/app/prog", "env:LBL"); err != nil || out != "LBL=1\n" {
			t.Errorf("exec after the label change: %v: %q, want the running process's LBL=1", err, out)
		}
		// The node reads ConfigMaps when it passes a pod on; an annotation
		// makes it do that.
		unchanged("ConfigMap change", providerUpdates(t, c, "restarts"), func() {
			cm.Data["k"] = "second"
			if _, err := c.CoreV1().ConfigMaps("default").Update(cx, cm, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			if out, err := s.kubectl("annotate", "pod", "restarts", "touched=yes"); err != nil {
				t.Fatalf("kubectl annotate: %v: %s", err, out)
			}
		})

		// A new image restarts the container, once, with the image's
		// config and the env resolved anew (as the kubelet resolves it at
		// each start).
		restarts, pid := current()
		if out, err := s.kubectl("set", "image", "pod/restarts", "main="+ref2); err != nil {
			t.Fatalf("kubectl set image: %v: %s", err, out)
		}
		waitPod(t, c, "restarts", 2*time.Minute, func(p *corev1.Pod) error {
			st := p.Status.ContainerStatuses
			if len(st) != 1 || st[0].RestartCount != restarts+1 || st[0].State.Running == nil || st[0].Image != ref2 {
				return fmt.Errorf("statuses %+v", st)
			}
			return nil
		})
		waitLogs(t, s, "restarts", "LBL=2\nK=second\nIMAGE_VERSION=two\n")
		_, newPid := current()
		if newPid == pid {
			t.Fatalf("pid %d unchanged after the image change", pid)
		}
		time.Sleep(5 * time.Second)
		if r, p := current(); r != restarts+1 || p != newPid {
			t.Fatalf("restarted more than once: restartCount %d (want %d), pid %d (want %d)", r, restarts+1, p, newPid)
		}
	})
}

// readPid reads the pid of a live process that the test program wrote with
// "pid:<file>" (after a restart, the file names the dead process until the
// new one writes it).
func readPid(t *testing.T, file string) int {
	t.Helper()
	var pid int
	waitFor(t, 30*time.Second, "pid file "+file, func() error {
		b, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		if pid, err = imagetest.HostPid(string(b)); err != nil {
			return err
		}
		_, err = os.Stat(fmt.Sprintf("/proc/%d", pid))
		return err
	})
	return pid
}

// waitLogs waits until the current attempt's log contains want.
func waitLogs(t *testing.T, s *server, pod, want string) {
	t.Helper()
	waitFor(t, time.Minute, "logs of "+pod, func() error {
		out, err := s.kubectl("logs", pod)
		if err != nil || !strings.Contains(out, want) {
			return fmt.Errorf("%v: want %q in:\n%s", err, want, out)
		}
		return nil
	})
}

// providerUpdates counts the updates Virtual Kubelet passed to the provider
// for a pod (its ProviderUpdateSuccess events, aggregated or not).
func providerUpdates(t *testing.T, c kubernetes.Interface, pod string) int {
	t.Helper()
	evs, err := c.CoreV1().Events("default").List(ctx(t), metav1.ListOptions{
		FieldSelector: "involvedObject.name=" + pod + ",reason=ProviderUpdateSuccess"})
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range evs.Items {
		n += max(int(e.Count), 1)
	}
	return n
}
