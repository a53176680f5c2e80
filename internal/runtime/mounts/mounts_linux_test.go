//go:build linux

package mounts

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const childEnv = "K3SM_MOUNTS_TEST_CHILD"

// childPlan is what the re-executed test binary applies and checks.
type childPlan struct {
	Mounts []Mount `json:"mounts"`
	Stage  string  `json:"stage"`
	// Files: path -> content expected inside the namespace.
	Files map[string]string `json:"files"`
	// Absent: paths that must not exist inside.
	Absent []string `json:"absent"`
	// Keep: directories whose original entries must all still be there.
	Keep []string `json:"keep"`
	// ReadOnly: files whose write must fail with EROFS.
	ReadOnly []string `json:"readOnly"`
	// Links: symlink -> its expected destination.
	Links map[string]string `json:"links"`
}

// TestHelperChild is the namespace side of TestApply: it does nothing
// unless started by it.
func TestHelperChild(t *testing.T) {
	raw := os.Getenv(childEnv)
	if raw == "" {
		t.Skip("helper for TestApply")
	}
	var plan childPlan
	if err := json.Unmarshal([]byte(raw), &plan); err != nil {
		fmt.Println("FAIL plan:", err)
		os.Exit(1)
	}
	var fails []string
	fail := func(f string, a ...any) { fails = append(fails, fmt.Sprintf(f, a...)) }
	before := map[string][]string{}
	for _, d := range plan.Keep {
		before[d] = names(d)
	}
	if err := Apply(plan.Mounts, plan.Stage); err != nil {
		fmt.Println("FAIL apply:", err)
		os.Exit(1)
	}
	for p, want := range plan.Files {
		if b, err := os.ReadFile(p); err != nil || string(b) != want {
			fail("read %s: %q %v, want %q", p, b, err, want)
		}
	}
	for _, p := range plan.Absent {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			fail("%s exists inside (%v)", p, err)
		}
	}
	for _, d := range plan.Keep {
		after := names(d)
		for _, n := range before[d] {
			if !slices.Contains(after, n) {
				fail("%s lost entry %s after the mirror", d, n)
			}
		}
	}
	for _, p := range plan.ReadOnly {
		err := os.WriteFile(p, []byte("x"), 0o644)
		if !errors.Is(err, syscall.EROFS) {
			fail("write %s: %v, want EROFS", p, err)
		}
	}
	for l, want := range plan.Links {
		if got, err := os.Readlink(l); err != nil || got != want {
			fail("readlink %s: %q %v, want %q", l, got, err, want)
		}
	}
	// /proc and /dev still work.
	if b, err := os.ReadFile("/proc/self/stat"); err != nil || !strings.HasPrefix(string(b), fmt.Sprint(os.Getpid())+" ") {
		fail("/proc/self/stat: %q %v", b, err)
	}
	if _, err := os.ReadFile("/proc/self/mountinfo"); err != nil {
		fail("/proc/self/mountinfo: %v", err)
	}
	if f, err := os.OpenFile("/dev/null", os.O_WRONLY, 0); err != nil {
		fail("/dev/null: %v", err)
	} else {
		f.Close()
	}
	if wd, err := os.Getwd(); err != nil || wd != "/" && !strings.HasPrefix(wd, "/") {
		fail("getwd: %q %v", wd, err)
	}
	// Children started with StartWithoutCaps have no capabilities left.
	var status []byte
	err := StartWithoutCaps(func() error {
		var err error
		status, err = exec.Command("cat", "/proc/self/status").Output()
		return err
	})
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) == 2 && (f[0] == "CapAmb:" || os.Getuid() != 0 && f[0] == "CapEff:") && strings.Trim(f[1], "0") != "" {
			fail("child started without caps: %s", line)
		}
	}
	if err != nil || !strings.Contains(string(status), "CapAmb:") {
		fail("status of a child: %v", err)
	}
	for _, f := range fails {
		fmt.Println("FAIL", f)
	}
	if len(fails) > 0 {
		os.Exit(1)
	}
	// Stay alive for EnterArgv until stdin closes.
	fmt.Println("READY")
	io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

func names(dir string) []string {
	des, _ := os.ReadDir(dir)
	var out []string
	for _, de := range des {
		out = append(out, de.Name())
	}
	return out
}

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestApplyRefusesHostNamespace(t *testing.T) {
	err := Apply([]Mount{{Source: t.TempDir(), Target: filepath.Join(t.TempDir(), "x")}}, t.TempDir())
	// Not root, the kernel refuses too (when the parent cannot be read).
	if err == nil || os.Geteuid() == 0 && !strings.Contains(err.Error(), "shares its parent's mount namespace") {
		t.Fatalf("Apply in the test's own namespace: %v", err)
	}
}

func TestEnterArgvSameNamespace(t *testing.T) {
	argv := []string{"/bin/echo", "hi"}
	got, err := EnterArgv(os.Getpid(), "/tmp", argv)
	if err != nil || !slices.Equal(got, argv) {
		t.Fatalf("EnterArgv into our own namespace: %q %v, want argv unchanged", got, err)
	}
	if _, err := EnterArgv(-1, "", argv); err == nil {
		t.Fatal("EnterArgv for no such process: no error")
	}
}

func TestApplyAsRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (TestApplyUserNamespace covers the unprivileged case)")
	}
	testApply(t, true)
}

func TestApplyUserNamespace(t *testing.T) {
	// As root this still runs the unprivileged path: a user namespace
	// (root mapped to itself), where inherited mounts are locked.
	if os.Geteuid() != 0 && !Namespaced() {
		t.Skip("unprivileged user namespaces are not usable here")
	}
	testApply(t, false)
}

func testApply(t *testing.T, root bool) {
	tmp := t.TempDir()
	rnd := fmt.Sprintf("k3sm-test-%d-%d", os.Getpid(), time.Now().UnixNano()%1e9)
	top := "/" + rnd
	runDir := "/run/" + rnd
	t.Cleanup(func() {
		// Only if the test failed badly: never leave these on the host.
		os.RemoveAll(top)
		os.RemoveAll(runDir)
	})

	vol := filepath.Join(tmp, "vol")
	write(t, filepath.Join(vol, "hello"), "vol")
	os.Mkdir(filepath.Join(vol, "sub"), 0o755)
	vol2 := filepath.Join(tmp, "vol2")
	write(t, filepath.Join(vol2, "kid"), "kid")
	ro := filepath.Join(tmp, "ro")
	write(t, filepath.Join(ro, "r"), "r")
	file := filepath.Join(tmp, "app.conf")
	write(t, file, "filevol")

	exists := filepath.Join(tmp, "exists")
	write(t, filepath.Join(exists, "orig"), "orig")
	mir := filepath.Join(tmp, "mirror")
	write(t, filepath.Join(mir, "d", "x"), "x")
	write(t, filepath.Join(mir, "f"), "f")
	os.Symlink("f", filepath.Join(mir, "l"))
	mirBefore := names(mir)
	runBefore := names("/run")
	rootBefore := names("/")

	plan := childPlan{
		Stage: filepath.Join(tmp, "stage"),
		Mounts: []Mount{
			{Source: vol, Target: exists},                                         // target exists
			{Source: vol, Target: filepath.Join(mir, "new", "deep")},              // missing under a temp dir
			{Source: vol2, Target: filepath.Join(mir, "new", "other")},            // same mirror again
			{Source: vol, Target: "/var/run/" + rnd + "/v"},                       // symlinked parent, mirror of /run
			{Source: vol, Target: top + "/data"},                                  // missing right under /
			{Source: vol2, Target: top + "/data/sub"},                             // nested, existing in the parent
			{Source: file, Target: top + "/etc/app.conf"},                         // file mount, missing parents
			{Source: ro, Target: top + "/ro", ReadOnly: true},                     // read-only
			{Source: vol2, Target: top + "/ro/kid"},                               // missing under a read-only mount
			{Source: file, Target: filepath.Join(mir, "f"), ReadOnly: true},       // file onto an existing file
			{Source: vol2, Target: filepath.Join(tmp, "exists", "sub", "nested")}, // missing in an earlier writable mount
		},
		Files: map[string]string{
			filepath.Join(exists, "hello"):                "vol",
			filepath.Join(mir, "new", "deep", "hello"):    "vol",
			filepath.Join(mir, "new", "other", "kid"):     "kid",
			filepath.Join(mir, "d", "x"):                  "x",
			filepath.Join(mir, "f"):                       "filevol",
			"/var/run/" + rnd + "/v/hello":                "vol",
			runDir + "/v/hello":                           "vol",
			top + "/data/hello":                           "vol",
			top + "/data/sub/kid":                         "kid",
			top + "/etc/app.conf":                         "filevol",
			top + "/ro/r":                                 "r",
			top + "/ro/kid/kid":                           "kid",
			filepath.Join(exists, "sub", "nested", "kid"): "kid",
		},
		Absent:   []string{filepath.Join(exists, "orig")},
		Keep:     []string{mir, "/run", "/", tmp},
		ReadOnly: []string{top + "/ro/r", filepath.Join(mir, "f")},
		Links:    map[string]string{filepath.Join(mir, "l"): "f"},
	}
	raw, _ := json.Marshal(plan)
	attr := sysProcAttr(nil, root)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperChild$", "-test.v")
	cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
	cmd.SysProcAttr = attr
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start in a new mount namespace: %v", err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	sc := bufio.NewScanner(stdout)
	ready := false
	var out []string
	for sc.Scan() {
		out = append(out, sc.Text())
		if sc.Text() == "READY" {
			ready = true
			break
		}
	}
	if !ready {
		cmd.Wait()
		t.Fatalf("child in the namespace failed:\n%s", strings.Join(out, "\n"))
	}

	// EnterArgv runs commands in the child's namespace.
	argv, err := EnterArgv(cmd.Process.Pid, "", []string{"cat", top + "/data/hello"})
	if err != nil {
		t.Fatal(err)
	}
	if !root && !slices.Contains(argv, "--user") {
		t.Errorf("EnterArgv into a user namespace: %q lacks --user", argv)
	}
	if b, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil || string(b) != "vol" {
		t.Errorf("%q: %q %v", argv, b, err)
	}
	argv, _ = EnterArgv(cmd.Process.Pid, top+"/data", []string{"/bin/sh", "-c", "pwd; cat sub/kid; touch " + top + "/made-inside"})
	if b, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil || string(b) != top+"/data\nkid" {
		t.Errorf("%q: %q %v", argv, b, err)
	}

	// Nothing of it on the host.
	for _, p := range []string{top, runDir, filepath.Join(mir, "new"), filepath.Join(ro, "kid")} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s exists on the host (%v)", p, err)
		}
	}
	for dir, want := range map[string][]string{mir: mirBefore, "/run": runBefore, "/": rootBefore} {
		if got := names(dir); !slices.Equal(got, want) {
			t.Errorf("host %s changed: %q, was %q", dir, got, want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(mir, "f")); string(b) != "f" {
		t.Errorf("host %s/f: %q", mir, b)
	}
	if b, _ := os.ReadFile(filepath.Join(exists, "orig")); string(b) != "orig" {
		t.Errorf("host %s/orig: %q", exists, b)
	}
	// As with runc, a mount point missing inside an earlier writable mount
	// is made in that mount's source.
	if _, err := os.Stat(filepath.Join(vol, "sub", "nested")); err != nil {
		t.Errorf("nested mount point in the parent volume: %v", err)
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Errorf("child: %v", err)
	}
}

func TestApplyErrorsNameTheMount(t *testing.T) {
	if os.Geteuid() != 0 && !Namespaced() {
		t.Skip("no mount namespaces here")
	}
	tmp := t.TempDir()
	f := filepath.Join(tmp, "file")
	write(t, f, "x")
	for _, tc := range []struct {
		m    Mount
		want string
	}{
		{Mount{Source: filepath.Join(tmp, "nope"), Target: filepath.Join(tmp, "t")}, "source"},
		{Mount{Source: f, Target: tmp}, "is not a directory but " + tmp + " is a directory"},
		{Mount{Source: tmp, Target: "rel"}, "not an absolute path"},
	} {
		raw, _ := json.Marshal(childPlan{Mounts: []Mount{tc.m}, Stage: filepath.Join(tmp, "stage")})
		attr := SysProcAttr(nil)
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperChild$")
		cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
		cmd.SysProcAttr = attr
		out, _ := cmd.CombinedOutput()
		want := fmt.Sprintf("FAIL apply: volume mount %s → %s: ", tc.m.Source, tc.m.Target)
		if !strings.Contains(string(out), want) || !strings.Contains(string(out), tc.want) {
			t.Errorf("%+v: %s\nwant %q ... %q", tc.m, out, want, tc.want)
		}
	}
}

// TestApplyUnprivileged runs TestApplyUserNamespace again as nobody when the
// tests run as root: the daemon's unprivileged case for real (capabilities
// only through SysProcAttr's ambient CAP_SYS_ADMIN, host files unmapped).
func TestApplyUnprivileged(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runs as root and drops to nobody; TestApplyUserNamespace covers a non-root run")
	}
	if testing.Short() {
		t.Skip("-short")
	}
	dir, err := os.MkdirTemp("", "k3sm-mounts")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	bin := filepath.Join(dir, "mounts.test")
	raw, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, raw, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^(TestApplyUserNamespace|TestApplyErrorsNameTheMount)$", "-test.v")
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "TMPDIR=" + os.TempDir()}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if strings.Contains(string(out), "SKIP") {
		t.Skipf("as nobody: %s", out)
	}
	if err != nil || !strings.Contains(string(out), "--- PASS: TestApplyUserNamespace") {
		t.Fatalf("as nobody: %v\n%s", err, out)
	}
}

// TestIDMap: through an idmapped tree a file's on-disk ids appear as the
// user namespace maps them (so a pod of that namespace sees them as they
// are on disk), and a filesystem without idmapped mounts is refused.
func TestIDMap(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: only the host's root may create idmapped mounts")
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep(1) to hold a user namespace")
	}
	holder := exec.Command(sleep, "60")
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 200000, Size: 65536}}
	holder.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER, UidMappings: m, GidMappings: m}
	if err := holder.Start(); err != nil {
		t.Skipf("no user namespace: %v", err)
	}
	defer func() { holder.Process.Kill(); holder.Wait() }()
	userns := fmt.Sprintf("/proc/%d/ns/user", holder.Process.Pid)

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(dir, "f"), 1000, 1001); err != nil {
		t.Fatal(err)
	}
	tree, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(tree)
	if err := IDMap(tree, userns); err != nil {
		t.Fatalf("IDMap of %s: %v", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(tree, "f", &st, 0); err != nil {
		t.Fatal(err)
	}
	// On disk 1000:1001; the pod's ids 1000:1001 are the host's 201000:201001.
	if st.Uid != 201000 || st.Gid != 201001 {
		t.Errorf("through the idmapped tree the file is %d:%d, want 201000:201001", st.Uid, st.Gid)
	}

	proc, err := unix.OpenTree(unix.AT_FDCWD, "/proc", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(proc)
	if err := IDMap(proc, userns); err == nil || !strings.Contains(err.Error(), "does not support idmapped mounts") {
		t.Errorf("IDMap of /proc: %v, want a refusal naming idmapped mounts", err)
	}
}
