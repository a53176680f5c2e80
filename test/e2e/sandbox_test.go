package e2e

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/k3sm-dev/k3sm/internal/runtime/imagetest"
)

// attackScript tries, one line per case, what a pod must not reach, and
// prints "denied <case>" or "ALLOWED <case>"; then what a pod may do with
// its own files ("own <case> ok|FAILED"). $OUT is where it writes.
const attackScript = `
try() { name=$1; shift; if "$@" >/dev/null 2>&1; then echo "ALLOWED $name"; else echo "denied $name"; fi; }
try admin-kubeconfig cat "$DATA/admin.kubeconfig"
try admin-kubeconfig-via-proc cat "/proc/1/root$DATA/admin.kubeconfig"
try other-pod-root ls "$DATA/pods/$VICTIM_UID"
try other-pod-volume cat "$DATA/pods/$VICTIM_UID/volumes/scratch/secret"
try other-pod-logs ls "$DATA/logs/pods"
try host-root cat "$ROOT_SECRET"
try host-home cat "$HOME_SECRET"
try signal-other-pod kill -0 "$VICTIM_PID"
try user-namespace unshare -U true
try mount mount -t tmpfs none /mnt
for s in $SOCKETS; do
	$PROG "unix:$s" | grep -q '^allowed' && echo "ALLOWED socket $s" || echo "denied socket $s"
done
$PROG bpf | grep -q '^allowed' && echo "ALLOWED bpf" || echo "denied bpf"
$PROG "ptrace:$VICTIM_PID" | grep -q '^allowed' && echo "ALLOWED ptrace" || echo "denied ptrace"
echo mine > /vol/own-$$ && [ "$(cat /vol/own-$$)" = mine ] && echo "own volume ok" || echo "own volume FAILED"
echo mine > $OWN/own-$$ && [ "$(cat $OWN/own-$$)" = mine ] && echo "own root ok" || echo "own root FAILED"
if [ -z "$NATIVE" ]; then echo mine > /etc/k3sm-e2e-attack && echo "own etc ok" || echo "own etc FAILED"; fi
echo done
`

// TestSandbox is the attack suite of the pod sandbox: from a pod's main
// process, an exec, an exec probe and a postStart hook, every case is
// denied, and the pod's own volume and root still work. Then
// securityContext, readOnlyRootFilesystem, the image root and Pod Security
// admission "restricted".
func TestSandbox(t *testing.T) {
	imagetest.RequireBusybox(t)
	imgs := buildImages(t)
	s := newServer(t)
	s.start()
	c := s.client()
	cx := ctx(t)

	// Secrets of the host's users, which no pod may read.
	rnd := strconv.FormatInt(time.Now().UnixNano(), 36)
	rootSecret := "/root/.k3sm-e2e-" + rnd
	homeDir := "/home/k3sm-e2e-" + rnd
	if err := os.WriteFile(rootSecret, []byte("root secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(rootSecret) })
	if err := os.MkdirAll(homeDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(homeDir) })
	os.WriteFile(homeDir+"/secret", []byte("home secret\n"), 0o644)

	// The victim: another pod with a volume.
	victim := nativePod("victim", imgs.prog, "forever")
	victim.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	victim.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}}
	if _, err := c.CoreV1().Pods("default").Create(cx, victim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	vp := waitPod(t, c, "victim", time.Minute, running)
	vpid := s.workloadPid(t, string(vp.UID), "main")

	// Every unix socket of the data dir (runtime, netd, kine, shims...).
	var socks []string
	filepath.WalkDir(s.dataDir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type()&fs.ModeSocket != 0 {
			socks = append(socks, p)
		}
		return nil
	})
	if len(socks) < 2 {
		t.Fatalf("found only %v sockets in %s", socks, s.dataDir)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "attack"}, Data: map[string]string{"attack.sh": attackScript}}
	if _, err := c.CoreV1().ConfigMaps("default").Create(cx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	run := func(out string) []string {
		return []string{"/bin/sh", "-c", "sh /attack/attack.sh > " + out + " 2>&1"}
	}
	// The test program, for an image: native attacker (from the scratch
	// directory every test pod mounts).
	prog, err := imagetest.BuildProg(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []struct{ name, image, prog, own, native string }{
		{"attacker", imgs.prog, "/app/prog", "/tmp", ""},
		{"native-attacker", "native", prog, "/run/k3sm-pod", "1"},
	} {
		attacker := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: a.name}, Spec: corev1.PodSpec{
			Volumes: []corev1.Volume{
				{Name: "attack", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "attack"}}}},
				{Name: "vol", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			},
			Containers: []corev1.Container{{Name: "main", Image: a.image, Command: []string{"/bin/sh", "-c", "sh /attack/attack.sh; sleep 100000"},
				Env: []corev1.EnvVar{{Name: "DATA", Value: s.dataDir}, {Name: "VICTIM_UID", Value: string(vp.UID)}, {Name: "VICTIM_PID", Value: strconv.Itoa(vpid)},
					{Name: "ROOT_SECRET", Value: rootSecret}, {Name: "HOME_SECRET", Value: homeDir + "/secret"}, {Name: "SOCKETS", Value: strings.Join(socks, " ")},
					{Name: "PROG", Value: a.prog}, {Name: "OWN", Value: a.own}, {Name: "NATIVE", Value: a.native}},
				VolumeMounts: []corev1.VolumeMount{{Name: "attack", MountPath: "/attack"}, {Name: "vol", MountPath: "/vol"}},
				Lifecycle:    &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: run("/vol/hook.out")}}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: run("/vol/probe.out")}},
					PeriodSeconds: 2, TimeoutSeconds: 20},
			}}}}
		s.createPod(t, attacker)
		waitPod(t, c, a.name, 2*time.Minute, func(p *corev1.Pod) error {
			if err := running(p); err != nil {
				return err
			}
			if len(p.Status.ContainerStatuses) == 0 || !p.Status.ContainerStatuses[0].Ready {
				return fmt.Errorf("not ready yet")
			}
			return nil
		})
		check := func(from, out string) {
			t.Helper()
			cases := 0
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				switch {
				case strings.HasPrefix(line, "denied "):
					cases++
				case strings.HasPrefix(line, "ALLOWED "), strings.Contains(line, "FAILED"):
					t.Errorf("%s, from %s: %s", a.name, from, line)
				}
			}
			if want := 12 + len(socks); cases != want || !strings.Contains(out, "own volume ok") || !strings.Contains(out, "own root ok") || !strings.HasSuffix(strings.TrimSpace(out), "done") {
				t.Errorf("%s, from %s: %d cases denied, want %d, and the pod's own files working:\n%s", a.name, from, cases, want, out)
			}
		}
		waitFor(t, 30*time.Second, "the main process's attack", func() error {
			out, _ := s.kubectl("logs", a.name)
			if !strings.Contains(out, "done") {
				return fmt.Errorf("log so far: %q", out)
			}
			return nil
		})
		out, _ := s.kubectl("logs", a.name)
		t.Logf("the attack from %s's main process:\n%s", a.name, out)
		check("the main process", out)
		out, err := s.kubectl("exec", a.name, "--", "sh", "/attack/attack.sh")
		if err != nil {
			t.Fatalf("exec: %v\n%s", err, out)
		}
		check("kubectl exec", out)
		for _, f := range []string{"hook", "probe"} {
			out, err := s.kubectl("exec", a.name, "--", "cat", "/vol/"+f+".out")
			if err != nil {
				t.Fatalf("read the %s's result: %v\n%s", f, err, out)
			}
			check("the "+f, out)
		}
	}
	// The pod's writes to its /etc stayed in its own root.
	if _, err := os.Stat("/etc/k3sm-e2e-attack"); err == nil {
		os.Remove("/etc/k3sm-e2e-attack")
		t.Error("a pod's write to /etc reached the host's /etc")
	}

	t.Run("port-forward reaches only the pod's network", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Write([]byte("host loopback service\n"))
				c.Close()
			}
		}()
		port := ln.Addr().(*net.TCPAddr).Port
		got := portForwardOnce(t, s, "attacker", port)
		if strings.Contains(got, "host loopback service") {
			t.Errorf("port-forward to the pod reached the host's 127.0.0.1:%d", port)
		}
	})

	t.Run("securityContext", func(t *testing.T) {
		p := nativePod("ids", imgs.prog, "forever")
		p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](1000), RunAsGroup: ptr.To[int64](3000),
			FSGroup: ptr.To[int64](2000), SupplementalGroups: []int64{4000}}
		p.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
		p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{ReadOnlyRootFilesystem: ptr.To(true)}
		if _, err := c.CoreV1().Pods("default").Create(cx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPod(t, c, "ids", time.Minute, running)
		out, err := s.kubectl("exec", "ids", "--", "sh", "-c", "id; touch /data/f && stat -c %u:%g /data/f; stat -c %g /data; touch /x 2>/dev/null && echo root-writable || echo root-read-only")
		if err != nil {
			t.Fatalf("exec: %v\n%s", err, out)
		}
		for _, want := range []string{"uid=1000(app) gid=3000(extra)", "2000", "4000", "1000:2000\n2000\n", "root-read-only"} {
			if !strings.Contains(out, want) {
				t.Errorf("exec as the securityContext says: no %q in\n%s", want, out)
			}
		}

		nonRoot := nativePod("nonroot", imgs.prog, "forever")
		nonRoot.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true)}
		priv := nativePod("priv", imgs.prog, "forever")
		priv.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
		for p, want := range map[*corev1.Pod]string{nonRoot: "runAsNonRoot and image will run as root", priv: "securityContext.privileged: true is refused"} {
			if _, err := c.CoreV1().Pods("default").Create(cx, p, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			waitPod(t, c, p.Name, time.Minute, func(p *corev1.Pod) error {
				if len(p.Status.ContainerStatuses) == 1 {
					if w := p.Status.ContainerStatuses[0].State.Waiting; w != nil && w.Reason == "CreateContainerConfigError" && strings.Contains(w.Message, want) {
						return nil
					}
				}
				return fmt.Errorf("not refused yet: %+v", p.Status.ContainerStatuses)
			})
		}
		// A refused container holds no start slot: more of them than the
		// runtime starts at once leave the node starting other pods.
		for i := range 2*goruntime.NumCPU() + 1 {
			p := nativePod(fmt.Sprintf("priv-%d", i), imgs.prog, "forever")
			p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
			if _, err := c.CoreV1().Pods("default").Create(cx, p, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			waitPod(t, c, p.Name, time.Minute, func(p *corev1.Pod) error {
				if len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Waiting != nil &&
					p.Status.ContainerStatuses[0].State.Waiting.Reason == "CreateContainerConfigError" {
					return nil
				}
				return fmt.Errorf("not refused yet: %+v", p.Status.ContainerStatuses)
			})
		}
		after := nativePod("after-refused", imgs.prog, "forever")
		if _, err := c.CoreV1().Pods("default").Create(cx, after, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPod(t, c, after.Name, time.Minute, running)
	})

	t.Run("image root", func(t *testing.T) {
		mk := func(name string) {
			p := nativePod(name, imgs.prog, "forever")
			if _, err := c.CoreV1().Pods("default").Create(cx, p, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			waitPod(t, c, name, time.Minute, running)
		}
		mk("root-a")
		mk("root-b")
		out, err := s.kubectl("exec", "root-a", "--", "sh", "-c", "ls /; echo a > /tmp/a")
		if err != nil {
			t.Fatal(err, out)
		}
		for _, entry := range strings.Fields(out) {
			switch entry {
			case "app", "bin", "dev", "etc", "home", "proc", "root", "sys", "tmp", "var": // var: the service account token
			default:
				t.Errorf("ls / in the pod shows %q, which the image does not have:\n%s", entry, out)
			}
		}
		// The image's fifo, its owner and mode kept, and working.
		if out, err := s.kubectl("exec", "root-a", "--", "sh", "-c", "echo through > /home/app/fifo & cat /home/app/fifo; stat -c '%F %u %a' /home/app/fifo"); err != nil || out != "through\nfifo 1000 600\n" {
			t.Errorf("the image's fifo /home/app/fifo: %v %q, want it passing a line and owned 1000, 0600", err, out)
		}
		s.kubectl("exec", "root-b", "--", "sh", "-c", "echo b > /tmp/b")
		if out, _ := s.kubectl("exec", "root-b", "--", "ls", "/tmp"); strings.TrimSpace(out) != "b" {
			t.Errorf("root-b's /tmp: %q, want only its own file", out)
		}
		s.deletePod(t, "root-a", 0)
		mk("root-a")
		if out, _ := s.kubectl("exec", "root-a", "--", "ls", "/tmp"); strings.TrimSpace(out) != "" {
			t.Errorf("a recreated pod's /tmp: %q, want empty", out)
		}

		// An image with its own libc (the host's /bin/ls from Debian's
		// packages, with its libraries and loader).
		dyn, err := imagetest.DynamicImage("/bin/ls")
		if err != nil {
			t.Fatal(err)
		}
		reg := imagetest.StartRegistry(t, "", "")
		p := nativePod("dynamic", reg.Push(t, "dynamic:v1", dyn))
		p.Spec.RestartPolicy = corev1.RestartPolicyNever
		p.Spec.Containers[0].Args = []string{"/"}
		if _, err := c.CoreV1().Pods("default").Create(cx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPod(t, c, "dynamic", time.Minute, func(p *corev1.Pod) error {
			if p.Status.Phase != corev1.PodSucceeded {
				return fmt.Errorf("phase %s", p.Status.Phase)
			}
			return nil
		})
		if out, _ := s.kubectl("logs", "dynamic"); !strings.Contains(out, "lib64") || strings.Contains(out, "home") {
			t.Errorf("ls / with its own libc printed %q, want the image's own root", out)
		}
	})

	t.Run("Pod Security restricted", func(t *testing.T) {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "restricted", Labels: map[string]string{
			"pod-security.kubernetes.io/enforce": "restricted"}}}
		if _, err := c.CoreV1().Namespaces().Create(cx, ns, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		plain := nativePod("plain", imgs.prog, "forever")
		if _, err := c.CoreV1().Pods("restricted").Create(cx, plain, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "violates PodSecurity") {
			t.Fatalf("a pod that is not restricted was admitted: %v", err)
		}
		p := nativePod("tight", imgs.prog, "forever")
		p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](1000),
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
		p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false),
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}
		waitFor(t, time.Minute, "the restricted pod admitted", func() error {
			_, err := c.CoreV1().Pods("restricted").Create(cx, p, metav1.CreateOptions{})
			return err // the namespace's service account may not exist yet
		})
		waitFor(t, time.Minute, "the restricted pod running", func() error {
			got, err := c.CoreV1().Pods("restricted").Get(cx, "tight", metav1.GetOptions{})
			if err != nil {
				return err
			}
			return running(got)
		})
		out, err := s.kubectl("exec", "-n", "restricted", "tight", "--", "cat", "/proc/self/status")
		if err != nil {
			t.Fatal(err, out)
		}
		for _, want := range []string{"NoNewPrivs:\t1", "Seccomp:\t2", "CapEff:\t0000000000000000", "CapBnd:\t0000000000000000", "Uid:\t1000\t1000\t1000\t1000"} {
			if !strings.Contains(out, want) {
				t.Errorf("the restricted pod's status lacks %q:\n%s", want, out)
			}
		}
	})
}

// workloadPid is the host pid of the container's process (its shim's record).
func (s *server) workloadPid(t *testing.T, uid, container string) int {
	t.Helper()
	var st struct {
		Pid int `json:"pid"`
	}
	b, err := os.ReadFile(filepath.Join(s.dataDir, "pods", uid, "attempts", container, "0", "shim.json"))
	if err == nil {
		err = json.Unmarshal(b, &st)
	}
	if err != nil || st.Pid <= 0 {
		t.Fatalf("workload pid of %s/%s: %v", uid, container, err)
	}
	return st.Pid
}

// portForwardOnce forwards a local port to port of pod and returns what
// one connection through it reads (empty when it is refused).
func portForwardOnce(t *testing.T, s *server, pod string, port int) string {
	t.Helper()
	local := freePort(t)
	pf := s.kubectlCmd("port-forward", "--address", "127.0.0.1", "pod/"+pod, fmt.Sprintf("%d:%d", local, port))
	pout := &outBuf{}
	pf.Stdout, pf.Stderr = pout, pout
	if err := pf.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { pf.Process.Kill(); pf.Wait() }()
	pout.waitFor(t, fmt.Sprintf("Forwarding from 127.0.0.1:%d", local), 30*time.Second)
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", local), 5*time.Second)
	if err != nil {
		return ""
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 256)
	n, _ := conn.Read(b)
	return string(b[:n])
}
