package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/k3sm-dev/k3sm/internal/runtime/imagetest"
)

// TestRootlessServer: `k3sm server` run by an unprivileged account with a
// subordinate id range runs a standard pod in the rootless sandbox: its
// image as "/", runAsUser and runAsGroup inside its user namespace (a
// subordinate id on the host), kubectl exec in the same boundary.
func TestRootlessServer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make the unprivileged account the server runs as")
	}
	const user, uid, sub = "k3sm-e2e-rootless", 64997, 3_100_000_000
	imagetest.RootlessAccount(t, user, uid, sub)
	// The binaries where the account can run them (the clone may be in
	// a directory only root enters).
	bin := t.TempDir()
	for _, d := range []string{bin, filepath.Dir(bin)} {
		os.Chmod(d, 0o755)
	}
	var bins []string
	for _, name := range []string{"k3sm", "k3sm-runtimed", "k3sm-shim", "k3sm-netd", "k3sm-helm"} {
		bins = append(bins, filepath.Join(filepath.Dir(k3smBin), name))
	}
	imagetest.CopyExecutables(t, bin, bins...)
	imgs := buildImages(t)
	s := newServer(t)
	home := filepath.Join(s.dataDir, "home")
	os.Mkdir(home, 0o755)
	for _, d := range []string{s.dataDir, home} {
		if err := os.Chown(d, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	s.bin, s.env = filepath.Join(bin, "k3sm"), []string{"HOME=" + home}
	s.cred = &syscall.Credential{Uid: uid, Gid: uid}
	s.start()

	c := s.client()
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: imgs.prog,
		Args:            []string{"ids", "ls:/", "forever"},
		SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To(int64(1000)), RunAsGroup: ptr.To(int64(2000))}}}}}
	pod.Name = "rootless"
	if _, err := c.CoreV1().Pods("default").Create(ctx(t), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, c, "rootless", 2*time.Minute, running)
	var logs string
	waitFor(t, 30*time.Second, "the pod's output", func() error {
		out, err := s.kubectl("logs", "rootless")
		logs = out
		if err != nil || !strings.Contains(out, "ls /:") {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	if !strings.Contains(logs, "ids uid=1000 gid=2000") {
		t.Errorf("identity in the pod: %q", logs)
	}
	if strings.Contains(logs, " usr") || !strings.Contains(logs, " app") {
		t.Errorf("the pod's / is not its image: %q", logs)
	}
	pids := s.workloadPids()
	if len(pids) != 1 {
		t.Fatalf("workload processes %v, want 1", pids)
	}
	st, err := os.Stat(fmt.Sprintf("/proc/%d", pids[0]))
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Sys().(*syscall.Stat_t).Uid; got != sub+999 {
		t.Errorf("the workload is host uid %d, want %d (the subordinate id of 1000)", got, sub+999)
	}
	out, err := s.kubectl("exec", "rootless", "--", "prog", "ids")
	if err != nil || !strings.Contains(out, "ids uid=1000 gid=2000") {
		t.Errorf("kubectl exec: %v: %q", err, out)
	}
	// Every process of the server runs as the account.
	for _, role := range []string{"kube-apiserver", "runtimed", "node"} {
		for _, pid := range s.childPids(role) {
			if fi, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil && fi.Sys().(*syscall.Stat_t).Uid != uid {
				t.Errorf("%s (pid %d) runs as uid %d", role, pid, fi.Sys().(*syscall.Stat_t).Uid)
			}
		}
	}
}
