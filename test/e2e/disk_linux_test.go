package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/k3sm-dev/k3sm/internal/runtime/imagetest"
)

// The data dir's disk nearly full: a server on a 320 MiB tmpfs, filled past
// the hard eviction thresholds, reports DiskPressure (and is tainted), its
// image GC removes an unused image but not one a pod uses, it keeps
// serving, and once the filler is gone the condition goes back to False.
// Container logs rotate on the way.
func TestDiskPressureAndImageGC(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a size-limited tmpfs for the data dir")
	}
	reg := imagetest.StartRegistry(t, "", "")
	img := progImage(t)
	kept := variant(t, img, func(cf *v1.ConfigFile) { cf.Config.Env = append(cf.Config.Env, "VARIANT=kept") })
	unused := reg.Push(t, "prog:unused", img)
	inUse := reg.Push(t, "prog:kept", kept)

	s := newServer(t, "--eviction-hard=nodefs.available<10%,imagefs.available<15%,nodefs.inodesFree<5%", "--image-minimum-gc-age=3s", "--image-gc-period=2s", "--housekeeping-interval=1s",
		"--eviction-pressure-transition-period=5s", "--container-log-max-size=16Ki", "--container-log-max-files=3")
	if err := unix.Mount("tmpfs", s.dataDir, "tmpfs", 0, "size=320m,mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs on %s: %v", s.dataDir, err)
	}
	t.Cleanup(func() {
		killLeftovers(s.dataDir)
		if err := unix.Unmount(s.dataDir, 0); err != nil {
			unix.Unmount(s.dataDir, unix.MNT_DETACH)
		}
	})
	s.start()
	c := s.client()

	diskPressure := func() (corev1.NodeCondition, bool) {
		n, err := c.CoreV1().Nodes().Get(ctx(t), "e2e-node", metav1.GetOptions{})
		if err != nil {
			return corev1.NodeCondition{}, false
		}
		tainted := false
		for _, tn := range n.Spec.Taints {
			tainted = tainted || tn.Key == corev1.TaintNodeDiskPressure
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeDiskPressure {
				return cond, tainted
			}
		}
		return corev1.NodeCondition{}, tainted
	}
	if cond, _ := diskPressure(); cond.Status != corev1.ConditionFalse || cond.Reason != "KubeletHasNoDiskPressure" {
		t.Fatalf("fresh node: DiskPressure %+v", cond)
	}

	// Container logs rotate at 16 KiB, 3 files kept, and kubectl logs
	// reads across them; a follow goes on through the rotations.
	chatty := nativePod("chatty", "native")
	chatty.Spec.Containers[0].Command = []string{"/bin/sh", "-c",
		`sleep 2; i=0; while [ $i -lt 3000 ]; do echo "line $i"; i=$((i+1)); [ $((i % 100)) = 0 ] && sleep 0.1; done; sleep 3600`}
	s.createPod(t, chatty)
	waitPod(t, c, "chatty", 2*time.Minute, running)
	follow := exec.Command(k3smBin, "kubectl", "--kubeconfig", s.kubeconfig(), "logs", "-f", "chatty")
	followOut, err := follow.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	followed := make(chan []string, 1)
	go func() {
		var lines []string
		sc := bufio.NewScanner(followOut)
		for sc.Scan() {
			lines = append(lines, sc.Text())
			if sc.Text() == "line 2999" {
				break
			}
		}
		followed <- lines
	}()
	select {
	case lines := <-followed:
		// Consecutive from where it started to the end: nothing lost or
		// repeated across the rotations.
		if len(lines) < 2000 {
			t.Errorf("kubectl logs -f saw %d lines", len(lines))
		}
		for i, l := range lines {
			if want := fmt.Sprintf("line %d", 3000-len(lines)+i); l != want {
				t.Errorf("kubectl logs -f line %d: %q, want %q", i, l, want)
				break
			}
		}
	case <-time.After(2 * time.Minute):
		t.Error("kubectl logs -f did not reach the last line")
	}
	follow.Process.Kill()
	follow.Wait()
	waitFor(t, time.Minute, "chatty's last line", func() error {
		out, err := s.kubectl("logs", "chatty", "--tail=2")
		if err != nil || out != "line 2998\nline 2999\n" {
			return fmt.Errorf("%q %v", out, err)
		}
		return nil
	})
	logDirs, _ := filepath.Glob(filepath.Join(s.dataDir, "logs", "pods", "default_chatty_*", "main"))
	if len(logDirs) != 1 {
		t.Fatalf("log dirs %v", logDirs)
	}
	files, _ := os.ReadDir(logDirs[0])
	var total int64
	for _, f := range files {
		if fi, err := f.Info(); err == nil {
			total += fi.Size()
		}
	}
	if len(files) != 3 || total > 3*(16<<10)+4096 {
		t.Errorf("chatty's log dir: %d files, %d bytes; want 3 files of at most ~16 KiB", len(files), total)
	}
	if out, err := s.kubectl("logs", "chatty"); err != nil || !strings.HasSuffix(out, "line 2999\n") || strings.Count(out, "\n") < 500 {
		t.Errorf("kubectl logs across rotated files: %d lines, %v", strings.Count(out, "\n"), err)
	}
	s.deletePod(t, "chatty", 0)

	// An image pulled by a pod that is then deleted, and one a pod keeps
	// using.
	s.createPod(t, nativePod("gone", unused, "echo:hi", "forever"))
	waitPod(t, c, "gone", 2*time.Minute, running)
	s.deletePod(t, "gone", 0)
	s.createPod(t, nativePod("stays", inUse, "echo:hi", "forever"))
	waitPod(t, c, "stays", 2*time.Minute, running)
	imageDirs := func() []string {
		d, _ := filepath.Glob(filepath.Join(s.dataDir, "images", "sha256", "*"))
		return d
	}
	if n := len(imageDirs()); n != 2 {
		t.Fatalf("%d images in the store, want 2", n)
	}
	if _, err := c.CoreV1().ConfigMaps("default").Create(ctx(t), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "before"},
		Data: map[string]string{"k": "v"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// Fill the disk to 5 % free: below nodefs.available<10%.
	var st unix.Statfs_t
	if err := unix.Statfs(s.dataDir, &st); err != nil {
		t.Fatal(err)
	}
	capacity, avail := int64(st.Blocks)*int64(st.Bsize), int64(st.Bavail)*int64(st.Bsize)
	fill := avail - capacity*5/100
	filler := filepath.Join(s.dataDir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, fill); err != nil {
		t.Fatalf("fallocate %d bytes: %v", fill, err)
	}
	f.Close()
	t.Logf("filled %d of %d bytes (%d were free)", fill, capacity, avail)

	waitFor(t, time.Minute, "DiskPressure=True and the disk-pressure taint", func() error {
		cond, tainted := diskPressure()
		if cond.Status != corev1.ConditionTrue || cond.Reason != "KubeletHasDiskPressure" || cond.Message != "kubelet has disk pressure" || !tainted {
			return fmt.Errorf("condition %+v, tainted %v", cond, tainted)
		}
		return nil
	})
	// Image GC: the unused image goes, the used one stays.
	waitFor(t, time.Minute, "the unused image removed", func() error {
		if d := imageDirs(); len(d) != 1 {
			return fmt.Errorf("images %v", d)
		}
		return nil
	})
	if out, err := s.kubectl("get", "events", "--field-selector", "involvedObject.kind=Node", "-o", "custom-columns=R:.reason", "--no-headers"); err != nil ||
		!strings.Contains(out, "EvictionThresholdMet") {
		t.Errorf("node events: %q %v", out, err)
	}
	if p := waitPod(t, c, "stays", 10*time.Second, running); p.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("the pod using the kept image restarted: %+v", p.Status.ContainerStatuses[0])
	}
	if out, err := s.kubectl("logs", "stays"); err != nil || out != "hi\n" {
		t.Errorf("logs of stays: %q %v", out, err)
	}
	// The server keeps working: existing objects read, new ones written.
	if cm, err := c.CoreV1().ConfigMaps("default").Get(ctx(t), "before", metav1.GetOptions{}); err != nil || cm.Data["k"] != "v" {
		t.Fatalf("configmap written before the disk filled: %v %v", cm, err)
	}
	if _, err := c.CoreV1().ConfigMaps("default").Create(ctx(t), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "during"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("write under disk pressure: %v", err)
	}

	// Disk freed: False again after the transition period, taint gone.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "DiskPressure=False and no taint", func() error {
		cond, tainted := diskPressure()
		if cond.Status != corev1.ConditionFalse || cond.Reason != "KubeletHasNoDiskPressure" || tainted {
			return fmt.Errorf("condition %+v, tainted %v", cond, tainted)
		}
		return nil
	})
	for _, name := range []string{"before", "during"} {
		if _, err := c.CoreV1().ConfigMaps("default").Get(ctx(t), name, metav1.GetOptions{}); err != nil {
			t.Errorf("configmap %s: %v", name, err)
		}
	}
	// A new pod schedules and runs again (it pulls the removed image).
	s.createPod(t, nativePod("after", unused, "echo:back", "forever"))
	waitPod(t, c, "after", 2*time.Minute, running)
	if out, err := exec.Command("df", "-h", s.dataDir).CombinedOutput(); err == nil {
		t.Logf("%s", out)
	}
}
