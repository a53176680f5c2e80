// Package vmtest boots the Linux host most users have, inside this one, for
// tests that need what the build machine is not: a Debian 12 guest with
// systemd as PID 1 on the unified cgroup v2 hierarchy, under QEMU (KVM when
// /dev/kvm opens, TCG otherwise). It owns the guest image (built once per
// machine from Debian packages and cached by version outside the clone),
// the boot, and the control channel (ssh on a forwarded 127.0.0.1 port, with
// a key made for the image). A directory of the caller's is shared into the
// guest read-only at /mnt/k3sm, as a disk image made per boot (Debian's
// cloud kernel has no 9p): test binaries and k3sm's binaries go there. The guest's network is QEMU's user mode with
// restrict=on: it reaches nothing outside the VM.
package vmtest

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/crypto/ssh"
)

// Suite is the Debian release of the guest: the one users' servers run.
const Suite = "bookworm"

// Mirror is where debootstrap fetches the guest's packages (the mirror this
// machine's apt uses).
const Mirror = "http://deb.debian.org/debian"

// Packages are the guest's Debian packages beyond debootstrap's minbase:
// systemd as init with logind and a user bus (systemd-run --user, for user
// delegation), Debian's cloud kernel, the ssh control channel, and what
// k3sm uses on a host (iproute2, nftables, uidmap for the rootless sandbox).
var Packages = []string{
	"systemd", "systemd-sysv", "udev", "dbus", "dbus-user-session", "libpam-systemd",
	"linux-image-cloud-amd64", "openssh-server",
	"iproute2", "nftables", "uidmap", "passwd", "procps", "kmod", "busybox-static",
}

// layout is the version of what setupRoot writes: bump it when that changes
// so every machine rebuilds its image.
const layout = "1"

// Image is a built guest: kernel, initrd, root filesystem and the key that
// logs in as root.
type Image struct {
	Dir    string // the cache directory of this version
	Kernel string
	Initrd string
	Disk   string // raw ext4, never written: each boot has a qcow2 overlay
	signer ssh.Signer
}

// Version names the image: the suite, the packages and the layout.
func Version() string {
	h := sha256.Sum256([]byte(Suite + "\n" + strings.Join(Packages, ",") + "\n" + layout))
	return fmt.Sprintf("%s-%x", Suite, h[:6])
}

// CacheDir is $K3SM_TEST_CACHE/vm, else ~/.cache/k3sm-test/vm.
func CacheDir() string {
	if d := os.Getenv("K3SM_TEST_CACHE"); d != "" {
		return filepath.Join(d, "vm")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = os.TempDir()
	}
	return filepath.Join(home, ".cache", "k3sm-test", "vm")
}

// Unavailable says why no guest can be built or booted on this machine, or
// "" when one can.
func Unavailable() string {
	if os.Geteuid() != 0 {
		return "building and booting the test VM needs root (debootstrap, mkfs.ext4 -d of a root-owned tree)"
	}
	for _, c := range []string{"qemu-system-x86_64", "qemu-img", "debootstrap", "mkfs.ext4"} {
		if _, err := exec.LookPath(c); err != nil {
			return c + " is not installed (apt-get install qemu-system-x86 qemu-utils debootstrap e2fsprogs)"
		}
	}
	return ""
}

// Build returns the cached image, building it first when this machine has
// none of this version (a few minutes: debootstrap from the mirror).
func Build(ctx context.Context, logf func(string, ...any)) (*Image, error) {
	if why := Unavailable(); why != "" {
		return nil, errors.New(why)
	}
	dir := filepath.Join(CacheDir(), Version())
	img := &Image{
		Dir:    dir,
		Kernel: filepath.Join(dir, "vmlinuz"),
		Initrd: filepath.Join(dir, "initrd.img"),
		Disk:   filepath.Join(dir, "disk.img"),
	}
	if _, err := os.Stat(filepath.Join(dir, "done")); err != nil {
		if err := build(ctx, img, logf); err != nil {
			return nil, fmt.Errorf("build the test VM image in %s: %w", dir, err)
		}
		// Other versions' images are of no more use here.
		old, _ := filepath.Glob(filepath.Join(CacheDir(), Suite+"-*"))
		for _, o := range old {
			if o != dir {
				os.RemoveAll(o)
			}
		}
	}
	key, err := os.ReadFile(filepath.Join(dir, "id_ed25519"))
	if err != nil {
		return nil, err
	}
	if img.signer, err = ssh.ParsePrivateKey(key); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, "id_ed25519"), err)
	}
	return img, nil
}

func build(ctx context.Context, img *Image, logf func(string, ...any)) error {
	if err := os.MkdirAll(img.Dir, 0o755); err != nil {
		return err
	}
	root := filepath.Join(img.Dir, "root.d")
	os.RemoveAll(root)
	defer os.RemoveAll(root)
	logf("test VM: debootstrap %s with %d packages from %s (a few minutes, once per machine)", Suite, len(Packages), Mirror)
	if out, err := exec.CommandContext(ctx, "debootstrap", "--variant=minbase",
		"--include="+strings.Join(Packages, ","), Suite, root, Mirror).CombinedOutput(); err != nil {
		return fmt.Errorf("debootstrap: %w\n%s", err, tail(out, 40))
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	block, err := ssh.MarshalPrivateKey(priv, "k3sm test VM")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(img.Dir, "id_ed25519"), pem.EncodeToMemory(block), 0o600); err != nil {
		return err
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		return err
	}
	if err := setupRoot(ctx, root, ssh.MarshalAuthorizedKey(sshPub)); err != nil {
		return err
	}
	// The kernel and initrd boot directly (-kernel): no bootloader.
	for dst, pattern := range map[string]string{img.Kernel: "boot/vmlinuz-*", img.Initrd: "boot/initrd.img-*"} {
		m, _ := filepath.Glob(filepath.Join(root, pattern))
		if len(m) != 1 {
			return fmt.Errorf("want one %s in the guest root, found %v", pattern, m)
		}
		if out, err := exec.CommandContext(ctx, "cp", m[0], dst).CombinedOutput(); err != nil {
			return fmt.Errorf("cp %s: %w: %s", m[0], err, out)
		}
	}
	logf("test VM: mkfs.ext4 -d (the guest's root filesystem)")
	tmp := img.Disk + ".tmp"
	os.Remove(tmp)
	if out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-L", "k3sm-vm", "-d", root, tmp, "6G").CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4: %w: %s", err, out)
	}
	if err := os.Rename(tmp, img.Disk); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(img.Dir, "done"), []byte(Version()+"\n"), 0o644)
}

// setupRoot makes the debootstrapped tree a bootable guest: its disk and
// the shared directory mounted, DHCP on the virtio NIC, root's ssh key,
// and none of the timers that would compete with the tests.
func setupRoot(ctx context.Context, root string, authorizedKey []byte) error {
	files := map[string]string{
		"etc/hostname": "k3sm-vm\n",
		"etc/hosts":    "127.0.0.1 localhost\n127.0.1.1 k3sm-vm\n",
		"etc/fstab": "/dev/vda / ext4 rw,discard 0 1\n" +
			"LABEL=" + ShareLabel + " " + ShareDir + " ext4 ro,nofail 0 0\n",
		"etc/systemd/network/10-virtio.network": "[Match]\nName=en*\n\n[Network]\nDHCP=ipv4\n",
		"etc/ssh/sshd_config.d/k3sm-vm.conf":    "PermitRootLogin prohibit-password\nUseDNS no\n",
		"root/.ssh/authorized_keys":             string(authorizedKey),
		// The control channel waits for nothing else at boot.
		"etc/systemd/system/systemd-networkd-wait-online.service.d/any.conf": "[Service]\nExecStart=\nExecStart=/lib/systemd/systemd-networkd-wait-online --any --timeout=20\n",
	}
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(root, "root/.ssh/authorized_keys"), 0o600); err != nil {
		return err
	}
	os.MkdirAll(filepath.Join(root, strings.TrimPrefix(ShareDir, "/")), 0o755)
	for _, args := range [][]string{
		{"systemctl", "enable", "systemd-networkd"},
		{"systemctl", "mask", "apt-daily.timer", "apt-daily-upgrade.timer", "man-db.timer", "e2scrub_all.timer", "fstrim.timer"},
	} {
		if out, err := exec.CommandContext(ctx, "chroot", append([]string{root}, args...)...).CombinedOutput(); err != nil {
			return fmt.Errorf("chroot %s: %w: %s", strings.Join(args, " "), err, out)
		}
	}
	for _, p := range []string{"var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/locale"} {
		os.RemoveAll(filepath.Join(root, p))
		os.MkdirAll(filepath.Join(root, p), 0o755)
	}
	return nil
}

func tail(b []byte, lines int) string {
	l := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}
