package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/k3sm-dev/k3sm/internal/testutil/poll"
)

// outBuf is a concurrency-safe buffer the test polls for text.
type outBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *outBuf) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *outBuf) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

func (o *outBuf) waitFor(t *testing.T, want string, timeout time.Duration) {
	t.Helper()
	poll.UntilNil(t, timeout, fmt.Sprintf("%q in the output", want), func() error {
		if out := o.String(); !strings.Contains(out, want) {
			return fmt.Errorf("output so far:\n%q", out)
		}
		return nil
	})
}

// startInPty starts cmd on a new terminal of rows x cols: what it prints
// collects in out, done gets its exit; the terminal is closed and the
// process killed when the test ends.
func startInPty(t *testing.T, cmd *exec.Cmd, rows, cols uint16) (*os.File, *outBuf, chan error) {
	t.Helper()
	term, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: rows, Cols: cols})
	if err != nil {
		t.Fatal(err)
	}
	out := &outBuf{}
	go io.Copy(out, term)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		term.Close()
	})
	return term, out, done
}

// kubectlCmd is a kubectl command against s, not yet started.
func (s *server) kubectlCmd(args ...string) *exec.Cmd {
	return exec.Command(k3smBin, append([]string{"kubectl", "--kubeconfig", s.kubeconfig()}, args...)...)
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// TestExecAttachPortForwardCp drives kubectl exec (with and without a
// terminal), attach, port-forward and cp through the node's kubelet API.
func TestExecAttachPortForwardCp(t *testing.T) {
	imgs := buildImages(t)
	s := newServer(t)
	s.start()
	c := s.client()

	s.deletePodsAtCleanup(t)

	shell := nativePod("shell", imgs.prog)
	if _, err := c.CoreV1().Pods("default").Create(ctx(t), shell, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, c, "shell", 2*time.Minute, running)

	t.Run("exec output and exit codes", func(t *testing.T) {
		out, err := s.kubectl("exec", "shell", "--", "prog", "echo:to stdout", "err:to stderr", "exit:3")
		if exitCode(err) != 3 || !strings.Contains(out, "to stdout") || !strings.Contains(out, "to stderr") {
			t.Fatalf("exec exit:3: code %d (%v), output %q", exitCode(err), err, out)
		}
		// The image is the pod's "/": its working dir is the image's.
		out, err = s.kubectl("exec", "shell", "-c", "main", "--", "sh", "-c", `echo "pwd=$(pwd) root=$K3SM_ROOT"`)
		if err != nil || !strings.Contains(out, "pwd=/app root=\n") {
			t.Fatalf("exec sh: %v %q (want pwd /app and no K3SM_ROOT)", err, out)
		}
		// A signal is the shell's 128+n.
		// $$ is the shell's: exec commands are not $(VAR)-expanded.
		out, err = s.kubectl("exec", "shell", "--", "sh", "-c", "kill -9 $$")
		if exitCode(err) != 137 {
			t.Fatalf("exec killed by SIGKILL: code %d %q", exitCode(err), out)
		}
		out, err = s.kubectl("exec", "shell", "--", "no-such-command-k3sm")
		if exitCode(err) != 127 || !strings.Contains(out, "no-such-command-k3sm") {
			t.Fatalf("exec of a missing command: code %d %q", exitCode(err), out)
		}
		// stdin without a terminal.
		cmd := s.kubectlCmd("exec", "-i", "shell", "--", "prog", "cat")
		cmd.Stdin = strings.NewReader("line one\nline two\n")
		b, err := cmd.CombinedOutput()
		if err != nil || string(b) != "line one\nline two\n" {
			t.Fatalf("exec -i cat: %v %q", err, b)
		}
	})

	t.Run("exec -it through a pty", func(t *testing.T) {
		cmd := s.kubectlCmd("exec", "-it", "shell", "--", "sh")
		cmd.Env = append(os.Environ(), "TERM=xterm")
		term, out, done := startInPty(t, cmd, 24, 80)
		// kubectl puts our terminal in raw mode: Enter is \r, which the pod's
		// terminal turns into \n. What we type comes back as its echo.
		io.WriteString(term, "test -t 0 && echo IS-$((6*7))-TTY; stty size\r")
		out.waitFor(t, "IS-42-TTY", 30*time.Second)
		out.waitFor(t, "24 80", 10*time.Second)
		if !strings.Contains(out.String(), "echo IS-$((6*7))-TTY") {
			t.Fatalf("no echo of the typed command: %q", out.String())
		}
		// Resizing our terminal reaches the pod's (SIGWINCH → kubectl → resize).
		if err := pty.Setsize(term, &pty.Winsize{Rows: 40, Cols: 120}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
		io.WriteString(term, "stty size\r")
		out.waitFor(t, "40 120", 10*time.Second)
		io.WriteString(term, "exit 5\r")
		select {
		case err := <-done:
			if exitCode(err) != 5 {
				t.Fatalf("kubectl exec -it exit code %d (%v), want 5; output %q", exitCode(err), err, out.String())
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("kubectl exec -it did not end after exit; output %q", out.String())
		}
	})

	t.Run("attach", func(t *testing.T) {
		p := nativePod("attached", imgs.prog, "echo:started", "cat", "echo:stdin closed", "exit:0")
		p.Spec.RestartPolicy = corev1.RestartPolicyNever
		p.Spec.Containers[0].Stdin, p.Spec.Containers[0].StdinOnce = true, true
		if _, err := c.CoreV1().Pods("default").Create(ctx(t), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPod(t, c, "attached", 2*time.Minute, running)
		// A watcher without stdin sees the output.
		watch := s.kubectlCmd("attach", "attached")
		wout := &outBuf{}
		watch.Stdout, watch.Stderr = wout, wout
		if err := watch.Start(); err != nil {
			t.Fatal(err)
		}
		defer watch.Process.Kill()
		wdone := make(chan error, 1)
		go func() { wdone <- watch.Wait() }()
		// The one with stdin types into the container.
		att := s.kubectlCmd("attach", "-i", "attached")
		in, err := att.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		aout := &outBuf{}
		att.Stdout, att.Stderr = aout, aout
		if err := att.Start(); err != nil {
			t.Fatal(err)
		}
		defer att.Process.Kill()
		adone := make(chan error, 1)
		go func() { adone <- att.Wait() }()
		// kubectl attach has no "attached" signal: type until the line
		// comes back to both (output from before a client attached is not
		// replayed to it, as with the kubelet).
		typed := 0
		poll.Every(t, context.Background(), 30*time.Second, 100*time.Millisecond, "the typed line seen by both attaches", func() error {
			if strings.Contains(aout.String(), "typed line") && strings.Contains(wout.String(), "typed line") {
				return nil
			}
			if typed%10 == 0 { // once a second
				io.WriteString(in, "typed line\n")
			}
			typed++
			return fmt.Errorf("attach -i %q, attach %q", aout.String(), wout.String())
		})
		if strings.Contains(aout.String(), "started") {
			t.Errorf("attach replayed output from before it attached: %q", aout.String())
		}
		// stdinOnce: closing kubectl's stdin closes the container's; cat
		// ends, the container prints and exits, and both attaches end.
		in.Close()
		for name, ch := range map[string]chan error{"attach -i": adone, "attach": wdone} {
			select {
			case err := <-ch:
				if err != nil {
					t.Errorf("kubectl %s: %v", name, err)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("kubectl %s did not end when the container exited", name)
			}
		}
		aout.waitFor(t, "stdin closed", time.Second)
		wout.waitFor(t, "stdin closed", time.Second)
		waitPod(t, c, "attached", time.Minute, func(p *corev1.Pod) error {
			if p.Status.Phase != corev1.PodSucceeded {
				return fmt.Errorf("phase %s", p.Status.Phase)
			}
			return nil
		})
		// What was typed is in the container's log too.
		if out, err := s.kubectl("logs", "attached"); err != nil || !strings.Contains(out, "started\ntyped line\n") || !strings.Contains(out, "stdin closed") {
			t.Fatalf("logs: %v %q", err, out)
		}
	})

	t.Run("attach -it to a tty container", func(t *testing.T) {
		p := nativePod("term", imgs.prog)
		p.Spec.RestartPolicy = corev1.RestartPolicyNever
		p.Spec.Containers[0].Command = []string{"sh"}
		p.Spec.Containers[0].Stdin, p.Spec.Containers[0].StdinOnce, p.Spec.Containers[0].TTY = true, true, true
		if _, err := c.CoreV1().Pods("default").Create(ctx(t), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPod(t, c, "term", 2*time.Minute, running)
		cmd := s.kubectlCmd("attach", "-it", "term")
		term, out, done := startInPty(t, cmd, 33, 99)
		// Type until the shell answers (the attach may not be up at once).
		typed := 0
		poll.Every(t, context.Background(), 30*time.Second, 100*time.Millisecond, "the shell's answer through attach -it", func() error {
			if strings.Contains(out.String(), "33 99") {
				return nil
			}
			if typed%10 == 0 { // once a second
				io.WriteString(term, "test -t 0 && stty size\r")
			}
			typed++
			return fmt.Errorf("output %q", out.String())
		})
		io.WriteString(term, "exit 3\r")
		select {
		case err := <-done:
			// The container's exit ends the attach; kubectl learns the code
			// from the pod, as with the kubelet.
			if err != nil {
				t.Fatalf("kubectl attach -it: %v; output %q", err, out.String())
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("kubectl attach -it did not end; output %q", out.String())
		}
		waitPod(t, c, "term", time.Minute, func(p *corev1.Pod) error {
			if p.Status.Phase != corev1.PodFailed || len(p.Status.ContainerStatuses) == 0 ||
				p.Status.ContainerStatuses[0].State.Terminated == nil || p.Status.ContainerStatuses[0].State.Terminated.ExitCode != 3 {
				return fmt.Errorf("phase %s, %+v", p.Status.Phase, p.Status.ContainerStatuses)
			}
			return nil
		})
	})

	t.Run("port-forward", func(t *testing.T) {
		podPort := freePort(t)
		p := nativePod("web", imgs.prog, "http:"+strconv.Itoa(podPort), "forever")
		p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: int32(podPort)}}
		if _, err := c.CoreV1().Pods("default").Create(ctx(t), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPod(t, c, "web", 2*time.Minute, running)
		localPort := freePort(t)
		pf := s.kubectlCmd("port-forward", "--address", "127.0.0.1", "pod/web", fmt.Sprintf("%d:%d", localPort, podPort))
		pout := &outBuf{}
		pf.Stdout, pf.Stderr = pout, pout
		if err := pf.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { pf.Process.Kill(); pf.Wait() }()
		pout.waitFor(t, fmt.Sprintf("Forwarding from 127.0.0.1:%d", localPort), 30*time.Second)
		// The pod's server may still be starting: a few tries.
		var body []byte
		waitFor(t, 30*time.Second, "HTTP through port-forward", func() error {
			resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/through-forward", localPort))
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			body, err = io.ReadAll(resp.Body)
			if err != nil {
				return err
			}
			if resp.StatusCode != http.StatusOK || len(body) == 0 {
				return fmt.Errorf("status %d body %q", resp.StatusCode, body)
			}
			return nil
		})
		if !strings.Contains(pout.String(), "Handling connection for") {
			t.Errorf("kubectl did not report the forwarded connection: %q", pout.String())
		}
		// A port nothing listens on is an error for that connection.
		dead := freePort(t)
		local2 := freePort(t)
		pf3 := s.kubectlCmd("port-forward", "--address", "127.0.0.1", "pod/web", fmt.Sprintf("%d:%d", local2, dead))
		p3out := &outBuf{}
		pf3.Stdout, pf3.Stderr = p3out, p3out
		if err := pf3.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { pf3.Process.Kill(); pf3.Wait() }()
		p3out.waitFor(t, fmt.Sprintf("Forwarding from 127.0.0.1:%d", local2), 30*time.Second)
		if resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", local2)); err == nil {
			resp.Body.Close()
			t.Fatalf("HTTP to a closed pod port succeeded: %s", resp.Status)
		}
		p3out.waitFor(t, "connection refused", 10*time.Second)
	})

	t.Run("cp both ways", func(t *testing.T) {
		local := t.TempDir()
		src := filepath.Join(local, "to-pod.txt")
		content := "copied into the pod\n" + strings.Repeat("x", 100000) + "\n"
		if err := os.WriteFile(src, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		// A relative path lands in the container's working directory (the
		// image's /app, in the pod's own root).
		if out, err := s.kubectl("cp", src, "default/shell:to-pod.txt"); err != nil {
			t.Fatalf("cp to pod: %v %s", err, out)
		}
		if got, err := s.kubectl("exec", "shell", "--", "cat", "/app/to-pod.txt"); err != nil || got != content {
			t.Fatalf("file in the pod root: %d bytes, want %d (%v)", len(got), len(content), err)
		}
		// And back, from a file the container wrote.
		if out, err := s.kubectl("exec", "shell", "--", "sh", "-c", "echo made in the pod > made.txt"); err != nil {
			t.Fatalf("exec: %v %s", err, out)
		}
		dst := filepath.Join(local, "from-pod.txt")
		if out, err := s.kubectl("cp", "default/shell:made.txt", dst); err != nil {
			t.Fatalf("cp from pod: %v %s", err, out)
		}
		if got := readFile(t, dst); got != "made in the pod\n" {
			t.Fatalf("copied back %q", got)
		}
		// A directory, both ways.
		dir := filepath.Join(local, "tree")
		os.MkdirAll(filepath.Join(dir, "sub"), 0o755)
		os.WriteFile(filepath.Join(dir, "sub", "a.txt"), []byte("a\n"), 0o644)
		if out, err := s.kubectl("cp", dir, "default/shell:tree"); err != nil {
			t.Fatalf("cp dir to pod: %v %s", err, out)
		}
		if got, err := s.kubectl("exec", "shell", "--", "cat", "/app/tree/sub/a.txt"); err != nil || got != "a\n" {
			t.Fatalf("dir in the pod root: %q %v", got, err)
		}
		back := filepath.Join(local, "tree-back")
		if out, err := s.kubectl("cp", "default/shell:tree", back); err != nil {
			t.Fatalf("cp dir from pod: %v %s", err, out)
		}
		if got := readFile(t, filepath.Join(back, "sub", "a.txt")); got != "a\n" {
			t.Fatalf("dir copied back: %q", got)
		}
		// An absolute path is the pod's own: nothing reaches the host.
		if out, err := s.kubectl("cp", src, "default/shell:/tmp/here.txt"); err != nil {
			t.Fatalf("cp to an absolute path: %v %s", err, out)
		}
		if got, _ := s.kubectl("exec", "shell", "--", "cat", "/tmp/here.txt"); got != content {
			t.Fatalf("absolute path: %d bytes", len(got))
		}
		if _, err := os.Stat("/tmp/here.txt"); err == nil {
			t.Fatal("kubectl cp to the pod's /tmp wrote the host's /tmp")
		}
	})
}
