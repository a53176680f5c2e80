package imagetest

import (
	"archive/tar"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// BusyboxPath is Debian's static busybox (package busybox-static), which
// test images carry as their /bin/sh and tools: a pod sees its image as
// "/", so a shell in an exec comes from the image, as with any image.
const BusyboxPath = "/bin/busybox"

// HasBusybox reports whether the static busybox is installed.
func HasBusybox() bool {
	f, err := elf.Open(BusyboxPath)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false // dynamic: it would not run inside an image
		}
	}
	return true
}

// RequireBusybox fails the test when test images have no shell.
func RequireBusybox(t testing.TB) {
	t.Helper()
	if !HasBusybox() {
		t.Fatalf("test images need a static busybox at %s for their shell: apt-get install busybox-static (.ci/run installs it)", BusyboxPath)
	}
}

// addSystem writes the small system a test image has: with tools, busybox
// and a link for each of its applets in /bin (when installed); /etc/passwd
// and /etc/group with root and an "app" user (1000:1000, a member of group
// "extra" 3000) whose home holds a fifo (/home/app/fifo, 0600), and /tmp.
func addSystem(tw *tar.Writer, now time.Time, tools bool) error {
	dir := func(name string, mode int64) {
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: mode, ModTime: now})
	}
	file := func(name string, mode int64, data []byte, uid, gid int) {
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: mode, Size: int64(len(data)), ModTime: now, Uid: uid, Gid: gid})
		tw.Write(data)
	}
	dir("etc/", 0o755)
	file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"), 0, 0)
	file("etc/group", 0o644, []byte("root:x:0:\napp:x:1000:\nextra:x:3000:app\nnogroup:x:65534:\n"), 0, 0)
	dir("root/", 0o700)
	dir("home/", 0o755)
	tw.WriteHeader(&tar.Header{Name: "home/app/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: now, Uid: 1000, Gid: 1000})
	tw.WriteHeader(&tar.Header{Name: "home/app/fifo", Typeflag: tar.TypeFifo, Mode: 0o600, ModTime: now, Uid: 1000, Gid: 1000})
	dir("tmp/", 0o1777)
	if !tools || !HasBusybox() {
		return nil
	}
	data, err := os.ReadFile(BusyboxPath)
	if err != nil {
		return fmt.Errorf("read %s: %w", BusyboxPath, err)
	}
	list, err := exec.Command(BusyboxPath, "--list").Output()
	if err != nil {
		return fmt.Errorf("%s --list: %w", BusyboxPath, err)
	}
	dir("bin/", 0o755)
	file("bin/busybox", 0o755, data, 0, 0)
	for _, a := range strings.Fields(string(list)) {
		if a == "busybox" {
			continue
		}
		tw.WriteHeader(&tar.Header{Name: "bin/" + a, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777, ModTime: now})
	}
	return nil
}
