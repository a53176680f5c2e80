//go:build linux

package sandbox

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const llEnv = "K3SM_LANDLOCK_TEST"

// llPlan is what the re-executed test binary does. Stage "apply" applies
// Policy to its thread and executes itself again in stage "check", which
// runs Ops in a process that is wholly under the policy, as a workload is.
type llPlan struct {
	Stage  string    `json:"stage"`
	Policy *Landlock `json:"policy"`
	Ops    []llOp    `json:"ops"`
	// Binary is what "apply" executes (a copy inside the policy).
	Binary string `json:"binary"`
	// NoNewPrivs sets no_new_privs on the thread before applying (an
	// unprivileged run needs it). Setuid drops to nobody (all threads,
	// keeping no capability) before applying, then reports and exits.
	NoNewPrivs bool `json:"noNewPrivs,omitempty"`
	Setuid     bool `json:"setuid,omitempty"`
	// Chroot: the helper holds a descriptor to Leak (a host directory),
	// chroots into Chroot, applies Policy and runs Ops on its own thread
	// without exec; op "leakread" opens Path relative to the descriptor.
	Chroot string `json:"chroot,omitempty"`
	Leak   string `json:"leak,omitempty"`
	// Bench: apply Policy this many times, each on a fresh thread, and
	// print the mean cost.
	Bench int `json:"bench,omitempty"`
}

// llOp is one access tried inside the policy; Want is "ok" or an errno
// name ("EACCES").
type llOp struct {
	Op   string `json:"op"`
	Path string `json:"path"`
	Want string `json:"want"`
}

func errName(err error) string {
	if err == nil {
		return "ok"
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return "exit " + strconv.Itoa(ee.ExitCode())
	}
	var en syscall.Errno
	if errors.As(err, &en) {
		return unix.ErrnoName(en)
	}
	return err.Error()
}

// run performs one op in the restricted process.
func (o llOp) run() string {
	switch o.Op {
	case "read":
		st, err := os.Stat(o.Path)
		if err != nil {
			return errName(err)
		}
		if st.IsDir() {
			_, err = os.ReadDir(o.Path)
		} else {
			_, err = os.ReadFile(o.Path)
		}
		return errName(err)
	case "write":
		f, err := os.OpenFile(o.Path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err == nil {
			_, err = f.WriteString("x")
			f.Close()
		}
		return errName(err)
	case "mkdir":
		return errName(os.Mkdir(o.Path, 0o755))
	case "remove":
		return errName(os.Remove(o.Path))
	case "exec":
		return errName(exec.Command(o.Path).Run())
	case "connect": // a pathname unix socket
		c, err := net.Dial("unix", o.Path)
		if err == nil {
			c.Close()
		}
		return errName(err)
	case "cat": // a grandchild: the policy survives exec and fork
		out, err := exec.Command("/bin/cat", o.Path).CombinedOutput()
		if err != nil && bytes.Contains(out, []byte("Permission denied")) {
			return "EACCES"
		}
		return errName(err)
	case "shwrite": // a grandchild writes through the shell
		out, err := exec.Command("/bin/sh", "-c", `echo x > "$1"`, "sh", o.Path).CombinedOutput()
		if err != nil && bytes.Contains(out, []byte("Permission denied")) {
			return "EACCES"
		}
		return errName(err)
	}
	return "unknown op " + o.Op
}

// TestLandlockHelper is the restricted side of the tests below: it does
// nothing unless started by them.
func TestLandlockHelper(t *testing.T) {
	raw := os.Getenv(llEnv)
	if raw == "" {
		t.Skip("helper for the Landlock tests")
	}
	var p llPlan
	if err := json.Unmarshal([]byte(raw), &p); err != nil {
		fmt.Println("FAIL plan:", err)
		os.Exit(1)
	}
	switch {
	case p.Bench > 0:
		benchChild(p)
	case p.Stage == "apply":
		runtime.LockOSThread()
		leak := -1
		if p.Chroot != "" {
			var err error
			if leak, err = unix.Open(p.Leak, unix.O_PATH|unix.O_DIRECTORY, 0); err != nil {
				fmt.Println("FAIL open leak:", err)
				os.Exit(1)
			}
			if err := syscall.Chroot(p.Chroot); err != nil {
				fmt.Println("FAIL chroot:", err)
				os.Exit(1)
			}
			if err := os.Chdir("/"); err != nil {
				fmt.Println("FAIL chdir:", err)
				os.Exit(1)
			}
		}
		if p.Setuid {
			if err := syscall.Setresgid(65534, 65534, 65534); err != nil {
				fmt.Println("FAIL setgid:", err)
				os.Exit(1)
			}
			if err := syscall.Setresuid(65534, 65534, 65534); err != nil {
				fmt.Println("FAIL setuid:", err)
				os.Exit(1)
			}
		}
		if p.NoNewPrivs {
			if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
				fmt.Println("FAIL no_new_privs:", err)
				os.Exit(1)
			}
		}
		abi, err := ApplyLandlock(p.Policy)
		if err != nil {
			fmt.Println("APPLYERR", err)
			os.Exit(0)
		}
		fmt.Println("ABI", abi)
		if p.Setuid {
			os.Exit(0)
		}
		if p.Chroot != "" {
			// This goroutine is locked to the restricted thread, so its
			// system calls are made under the policy.
			for i, o := range p.Ops {
				if o.Op == "leakread" {
					fd, err := unix.Openat(leak, o.Path, unix.O_RDONLY, 0)
					if err == nil {
						unix.Close(fd)
					}
					fmt.Printf("OP %d %s\n", i, errName(err))
				} else {
					fmt.Printf("OP %d %s\n", i, o.run())
				}
			}
			os.Exit(0)
		}
		p.Stage = "check"
		b, _ := json.Marshal(p)
		var env []string
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, llEnv+"=") {
				env = append(env, kv)
			}
		}
		env = append(env, llEnv+"="+string(b))
		err = syscall.Exec(p.Binary, []string{p.Binary, "-test.run=^TestLandlockHelper$"}, env)
		fmt.Println("FAIL exec:", err)
		os.Exit(1)
	case p.Stage == "check":
		nnp := "?"
		if s, err := os.ReadFile("/proc/self/status"); err == nil {
			for _, line := range strings.Split(string(s), "\n") {
				if v, ok := strings.CutPrefix(line, "NoNewPrivs:"); ok {
					nnp = strings.TrimSpace(v)
				}
			}
		}
		fmt.Println("NNP", nnp)
		for i, o := range p.Ops {
			fmt.Printf("OP %d %s\n", i, o.run())
		}
		os.Exit(0)
	}
}

// llResult is what the helper reported.
type llResult struct {
	ABI      int
	ApplyErr string
	NNP      string
	Ops      map[int]string
	Out      string
}

// runPlan copies the test binary to bin (which the policy must let read
// and execute) and runs p there.
func runPlan(t *testing.T, p llPlan, bin string, attr *syscall.SysProcAttr) llResult {
	t.Helper()
	if bin != "" {
		copyFile(t, os.Args[0], bin, 0o755)
		p.Binary = bin
	}
	p.Stage = "apply"
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestLandlockHelper$")
	cmd.Env = append(os.Environ(), llEnv+"="+string(b))
	cmd.SysProcAttr = attr
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	r := llResult{ABI: -1, Ops: map[int]string{}, Out: string(out)}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		f := strings.SplitN(line, " ", 3)
		switch f[0] {
		case "ABI":
			r.ABI, _ = strconv.Atoi(f[1])
		case "APPLYERR":
			r.ApplyErr = strings.TrimPrefix(line, "APPLYERR ")
		case "NNP":
			r.NNP = f[1]
		case "OP":
			i, _ := strconv.Atoi(f[1])
			r.Ops[i] = f[2]
		case "FAIL":
			t.Fatalf("helper: %s\n%s", line, out)
		}
	}
	return r
}

func checkOps(t *testing.T, p llPlan, r llResult) {
	t.Helper()
	if r.ApplyErr != "" {
		t.Fatalf("ApplyLandlock: %s", r.ApplyErr)
	}
	if want := LandlockABI(); r.ABI != want {
		t.Errorf("ApplyLandlock reported ABI %d, the kernel has %d", r.ABI, want)
	}
	for i, o := range p.Ops {
		if got := r.Ops[i]; got != o.Want {
			t.Errorf("%s %s: got %s, want %s", o.Op, o.Path, got, o.Want)
		}
	}
	if t.Failed() {
		t.Logf("helper output:\n%s", r.Out)
	}
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	raw, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, raw, mode); err != nil {
		t.Fatal(err)
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func needLandlock(t *testing.T) {
	t.Helper()
	if LandlockABI() == 0 {
		t.Skip("the kernel has no Landlock (or it is not in lsm=)")
	}
}

// noNewPrivsUnlessRoot: without CAP_SYS_ADMIN the helper needs
// no_new_privs to restrict itself.
func noNewPrivsUnlessRoot() bool { return os.Geteuid() != 0 }

// podLayout is a fake data dir with two pods, under a directory of its
// own (the host's /tmp stays denied: the pod's directory is listed).
type podLayout struct {
	data, pod, root, rw, ro, otherPod, bin, hostFile string
}

func newPodLayout(t *testing.T) podLayout {
	base := t.TempDir()
	l := podLayout{data: filepath.Join(base, "data")}
	l.pod = filepath.Join(l.data, "pods", "uid-1")
	l.root = filepath.Join(l.pod, "roots", "app")
	l.rw = filepath.Join(l.pod, "volumes", "cache")
	l.ro = filepath.Join(l.pod, "volumes", "config")
	l.otherPod = filepath.Join(l.data, "pods", "uid-2")
	l.bin = filepath.Join(l.pod, "bin", "sandbox.test")
	l.hostFile = filepath.Join(base, "host-file")
	write(t, filepath.Join(l.data, "admin.kubeconfig"), "cluster-admin")
	write(t, filepath.Join(l.root, "own"), "mine")
	write(t, filepath.Join(l.rw, "f"), "rw")
	write(t, filepath.Join(l.ro, "key"), "ro")
	write(t, filepath.Join(l.otherPod, "volumes", "secret", "token"), "theirs")
	write(t, filepath.Join(l.otherPod, "roots", "app", "file"), "theirs")
	write(t, filepath.Join(l.data, "logs", "pods", "ns_other_uid-2", "app", "0.log"), "their log")
	write(t, l.hostFile, "host")
	copyFile(t, "/bin/true", filepath.Join(l.data, "true"), 0o755)
	return l
}

// A native container: the system's directories and its own pod only.
func TestApplyLandlockNative(t *testing.T) {
	needLandlock(t)
	l := newPodLayout(t)
	pol := NativePolicy(l.pod, []string{l.root, l.rw}, []string{l.ro})
	sock := filepath.Join(l.data, "run.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ops := []llOp{
		{"read", "/etc/passwd", "ok"},
		{"read", "/usr/bin", "ok"},
		{"read", "/proc/self/status", "ok"},
		{"read", filepath.Join(l.root, "own"), "ok"},
		{"read", filepath.Join(l.ro, "key"), "ok"},
		{"read", filepath.Join(l.data, "admin.kubeconfig"), "EACCES"},
		{"read", filepath.Join(l.otherPod, "volumes", "secret", "token"), "EACCES"},
		{"read", filepath.Join(l.otherPod, "roots", "app", "file"), "EACCES"},
		{"read", filepath.Join(l.data, "logs", "pods", "ns_other_uid-2", "app", "0.log"), "EACCES"},
		{"read", l.data, "EACCES"},
		{"read", l.hostFile, "EACCES"},
		{"read", "/etc/shadow", "EACCES"},
		{"read", "/tmp", "EACCES"},
		{"write", "/dev/null", "ok"},
		{"write", "/proc/self/comm", "ok"},
		{"write", filepath.Join(l.root, "new"), "ok"},
		{"mkdir", filepath.Join(l.rw, "dir"), "ok"},
		{"remove", filepath.Join(l.rw, "f"), "ok"},
		{"write", filepath.Join(l.ro, "key"), "EACCES"},
		{"write", filepath.Join(l.pod, "planted"), "EACCES"},
		{"write", filepath.Join(l.data, "admin.kubeconfig"), "EACCES"},
		{"write", "/etc/k3sm-landlock-test", "EACCES"},
		{"write", "/usr/k3sm-landlock-test", "EACCES"},
		{"exec", "/bin/true", "ok"},
		{"exec", filepath.Join(l.data, "true"), "EACCES"},
		{"cat", filepath.Join(l.ro, "key"), "ok"},
		{"cat", filepath.Join(l.data, "admin.kubeconfig"), "EACCES"},
		{"shwrite", filepath.Join(l.rw, "from-sh"), "ok"},
		{"shwrite", filepath.Join(l.otherPod, "planted"), "EACCES"},
		// Not a right the policy handles (docs/runtime.md, "Not covered
		// by Landlock"): only DAC and the mount namespace hide a socket.
		{"connect", sock, "ok"},
	}
	for _, dir := range []string{"/root", "/home"} {
		if _, err := os.Stat(dir); err == nil {
			ops = append(ops, llOp{"read", dir, "EACCES"})
		}
	}
	p := llPlan{Policy: pol, Ops: ops, NoNewPrivs: noNewPrivsUnlessRoot()}
	r := runPlan(t, p, l.bin, nil)
	t.Cleanup(func() { os.Remove("/etc/k3sm-landlock-test"); os.Remove("/usr/k3sm-landlock-test") })
	checkOps(t, p, r)
	if _, err := os.Stat(filepath.Join(l.pod, "planted")); err == nil {
		t.Error("the denied write created a file")
	}
}

// An image container after pivot_root: "/" is its root. Here "/" is the
// host's, so reads everywhere are expected to work (the pivot hides the
// host); the test is about writes.
func TestApplyLandlockImage(t *testing.T) {
	needLandlock(t)
	for _, ro := range []bool{true, false} {
		t.Run(fmt.Sprintf("readOnlyRoot=%v", ro), func(t *testing.T) {
			l := newPodLayout(t)
			want := map[bool]string{true: "EACCES", false: "ok"}[ro]
			pol := ImagePolicy([]string{l.rw}, ro)
			ops := []llOp{
				{"read", "/etc/passwd", "ok"},
				{"read", filepath.Join(l.data, "admin.kubeconfig"), "ok"},
				{"exec", "/bin/true", "ok"},
				{"exec", filepath.Join(l.data, "true"), "ok"},
				{"write", "/dev/null", "ok"},
				{"write", "/proc/self/comm", "ok"},
				{"write", filepath.Join(l.rw, "f"), "ok"},
				{"mkdir", filepath.Join(l.rw, "d"), "ok"},
				{"shwrite", filepath.Join(l.rw, "sh"), "ok"},
				{"write", filepath.Join(l.root, "own"), want},
				{"mkdir", filepath.Join(l.root, "d"), want},
				{"remove", filepath.Join(l.ro, "key"), want},
				{"shwrite", filepath.Join(l.root, "sh"), want},
			}
			p := llPlan{Policy: pol, Ops: ops, NoNewPrivs: noNewPrivsUnlessRoot()}
			checkOps(t, p, runPlan(t, p, l.bin, nil))
		})
	}
}

// After the pivot (here a chroot) "/" is the container's root: a
// descriptor to a host directory that leaked past it reaches nothing,
// even with a writable root.
func TestApplyLandlockImageLeakedDescriptor(t *testing.T) {
	needLandlock(t)
	if os.Geteuid() != 0 {
		t.Skip("chroot needs root")
	}
	l := newPodLayout(t)
	ops := []llOp{
		{"read", "/own", "ok"},
		{"write", "/new", "ok"},
		{"leakread", "admin.kubeconfig", "EACCES"},
		{"leakread", "pods/uid-2/roots/app/file", "EACCES"},
	}
	p := llPlan{Policy: ImagePolicy(nil, false), Ops: ops, Chroot: l.root, Leak: l.data}
	checkOps(t, p, runPlan(t, p, "", nil))
}

// The shim's init is ns-root in the pod's user namespace and may have no
// no_new_privs: CAP_SYS_ADMIN there is enough, and no_new_privs stays off.
func TestApplyLandlockInUserNamespace(t *testing.T) {
	needLandlock(t)
	if _, err := os.Stat("/proc/self/ns/user"); err != nil {
		t.Skip("no user namespaces")
	}
	l := newPodLayout(t)
	pol := NativePolicy(l.pod, []string{l.rw}, nil)
	ops := []llOp{
		{"read", filepath.Join(l.ro, "key"), "ok"},
		{"write", filepath.Join(l.rw, "f"), "ok"},
		{"read", filepath.Join(l.data, "admin.kubeconfig"), "EACCES"},
		{"cat", filepath.Join(l.otherPod, "roots", "app", "file"), "EACCES"},
	}
	p := llPlan{Policy: pol, Ops: ops}
	attr := &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
	}
	r := runPlan(t, p, l.bin, attr)
	if r.ApplyErr != "" && strings.Contains(r.ApplyErr, "operation not permitted") && os.Geteuid() != 0 {
		t.Skipf("unprivileged user namespaces are restricted here: %s", r.ApplyErr)
	}
	checkOps(t, p, r)
	if r.NNP != "0" {
		t.Errorf("no_new_privs is %q in the workload, want 0 (ApplyLandlock must not set it)", r.NNP)
	}
}

// Without CAP_SYS_ADMIN and without no_new_privs the kernel refuses; the
// error says what to do. With no_new_privs on the thread it works.
func TestApplyLandlockNeedsPrivilege(t *testing.T) {
	needLandlock(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root to drop to nobody")
	}
	pol := &Landlock{ReadExec: []string{"/usr"}}
	r := runPlan(t, llPlan{Policy: pol, Setuid: true}, "", nil)
	if !strings.Contains(r.ApplyErr, "no_new_privs") || !strings.Contains(r.ApplyErr, "CAP_SYS_ADMIN") {
		t.Errorf("apply as nobody without no_new_privs: got %q (ABI %d), want an error naming no_new_privs and CAP_SYS_ADMIN", r.ApplyErr, r.ABI)
	}
	r = runPlan(t, llPlan{Policy: pol, Setuid: true, NoNewPrivs: true}, "", nil)
	if r.ApplyErr != "" || r.ABI != LandlockABI() {
		t.Errorf("apply as nobody with no_new_privs: err %q, ABI %d", r.ApplyErr, r.ABI)
	}
}

// Paths that do not exist are skipped, a path through a file too; a file
// gets the file rights only (a directory right on it would be EINVAL).
func TestApplyLandlockMissingPathsAndFiles(t *testing.T) {
	needLandlock(t)
	l := newPodLayout(t)
	file := filepath.Join(l.rw, "f")
	pol := &Landlock{
		ReadExec:  []string{"/usr", "/lib", "/lib64", "/etc/ld.so.cache", filepath.Dir(l.bin), "/does/not/exist", "/etc/passwd/below-a-file"},
		ReadWrite: []string{file, filepath.Join(l.pod, "missing-volume")},
	}
	ops := []llOp{
		{"write", file, "ok"},
		{"read", file, "ok"},
		{"read", "/usr/bin", "ok"},
		{"read", "/etc/passwd", "EACCES"},
		{"write", filepath.Join(l.rw, "g"), "EACCES"},
	}
	p := llPlan{Policy: pol, Ops: ops, NoNewPrivs: noNewPrivsUnlessRoot()}
	checkOps(t, p, runPlan(t, p, l.bin, nil))
}

// Bad input is refused before anything is restricted. Run on a thread of
// its own that ends with the goroutine, never the test's.
func TestApplyLandlockBadInput(t *testing.T) {
	cases := map[string]*Landlock{
		"no policy":                nil,
		"Landlock.ReadExec[1]":     {ReadExec: []string{"/usr", "etc"}},
		"Landlock.ReadWrite[0]":    {ReadWrite: []string{"./data"}},
		"Landlock.ReadWrite[0] \"": {ReadWrite: []string{""}},
	}
	for want, l := range cases {
		done := make(chan error)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
			_, err := ApplyLandlock(l)
			done <- err
		}()
		err := <-done
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ApplyLandlock(%+v): %v, want an error containing %q", l, err, want)
		}
	}
}

func TestLandlockABI(t *testing.T) {
	lsm, _ := os.ReadFile("/sys/kernel/security/lsm")
	abi := LandlockABI()
	if strings.Contains(string(lsm), "landlock") && abi < 1 {
		t.Errorf("landlock is in %q but LandlockABI() = %d", lsm, abi)
	}
	if len(lsm) > 0 && !strings.Contains(string(lsm), "landlock") && abi != 0 {
		t.Errorf("landlock is not in %q but LandlockABI() = %d", lsm, abi)
	}
	t.Logf("Landlock ABI %d", abi)
}

// benchChild applies p.Policy p.Bench times, each time on a new thread (a
// thread takes at most 16 stacked domains; a locked goroutine's thread
// ends with it), and prints the mean.
func benchChild(p llPlan) {
	var total time.Duration
	for i := 0; i < p.Bench; i++ {
		done := make(chan error)
		go func() {
			runtime.LockOSThread()
			if p.NoNewPrivs {
				unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
			}
			start := time.Now()
			_, err := ApplyLandlock(p.Policy)
			total += time.Since(start)
			done <- err
		}()
		if err := <-done; err != nil {
			fmt.Println("FAIL apply:", err)
			os.Exit(1)
		}
	}
	fmt.Println("NS", total.Nanoseconds()/int64(p.Bench))
	os.Exit(0)
}

// BenchmarkApplyLandlock: the cost of ApplyLandlock with a native pod's
// policy (its /etc entries, system dirs, volumes), measured in a child.
func BenchmarkApplyLandlock(b *testing.B) {
	if LandlockABI() == 0 {
		b.Skip("no Landlock")
	}
	dir := b.TempDir()
	for _, d := range []string{"roots/app", "volumes/a", "volumes/b"} {
		os.MkdirAll(filepath.Join(dir, d), 0o755)
	}
	for _, c := range []struct {
		name string
		pol  *Landlock
	}{
		{"native", NativePolicy(dir, []string{dir + "/roots/app", dir + "/volumes/a"}, []string{dir + "/volumes/b"})},
		{"image", ImagePolicy([]string{dir + "/volumes/a"}, true)},
	} {
		b.Run(c.name, func(b *testing.B) {
			raw, _ := json.Marshal(llPlan{Policy: c.pol, Bench: b.N, NoNewPrivs: noNewPrivsUnlessRoot()})
			cmd := exec.Command(os.Args[0], "-test.run=^TestLandlockHelper$")
			cmd.Env = append(os.Environ(), llEnv+"="+string(raw))
			out, err := cmd.CombinedOutput()
			if err != nil {
				b.Fatalf("%v\n%s", err, out)
			}
			var ns int64
			for _, line := range strings.Split(string(out), "\n") {
				if v, ok := strings.CutPrefix(line, "NS "); ok {
					ns, _ = strconv.ParseInt(v, 10, 64)
				}
			}
			if ns == 0 {
				b.Fatalf("no measurement:\n%s", out)
			}
			b.ReportMetric(float64(ns), "ns/apply")
			b.ReportMetric(float64(len(c.pol.ReadExec)+len(c.pol.ReadWrite)), "rules")
		})
	}
}
