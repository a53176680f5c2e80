//go:build linux

package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// debianMirror is the only Debian source this machine reaches.
const debianMirror = "http://deb.debian.org/debian"

// debianPackages go into the one Debian rootfs the Debian-based images
// share as their base layer (debootstrap --variant=minbase adds its
// required set: bash, coreutils, util-linux (ipcs), ...). Tools the
// conformance specs exec in agnhost: bind9-dnsutils (dig, nslookup), curl,
// netcat-openbsd (nc), iproute2 (ip, ss), socat; what upstream's Alpine
// agnhost also has: iperf, wget, ping, ps, busybox (busybox-static; the
// busybox images carry their own, see busybox.go); nginx the nginx images.
var debianPackages = []string{
	"bind9-dnsutils", "busybox-static", "ca-certificates", "curl", "iperf", "iproute2",
	"iputils-ping", "netcat-openbsd", "nginx", "procps", "socat", "util-linux", "wget",
}

// rootfsTrim are emptied after debootstrap: nothing in a test pod reads
// them.
var rootfsTrim = []string{
	"usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/lintian",
	"var/cache/apt", "var/lib/apt/lists", "var/cache/debconf/templates.dat-old",
	"var/log/apt", "var/log/bootstrap.log", "var/log/dpkg.log", "var/log/alternatives.log",
	// debootstrap copies the build host's; the runtime provides the pod's.
	"etc/resolv.conf", "etc/hostname",
}

// hostSuite is this machine's Debian release (VERSION_CODENAME in
// /etc/os-release), else bookworm.
func hostSuite() string {
	f, err := os.Open("/etc/os-release")
	if err != nil {
		return "bookworm"
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VERSION_CODENAME="); ok {
			if v = strings.Trim(v, `"'`); v != "" {
				return v
			}
		}
	}
	return "bookworm"
}

// rootfsKey names the rootfs by what debootstrap makes it from.
func rootfsKey(suite string) string {
	pkgs := append([]string(nil), debianPackages...)
	sort.Strings(pkgs)
	h := sha256.Sum256([]byte(strings.Join([]string{suite, debianMirror, strings.Join(pkgs, ","), strings.Join(rootfsTrim, ",")}, "\n")))
	return suite + "-" + hex.EncodeToString(h[:])[:12]
}

// ensureRootfs returns the cached Debian rootfs directory, making it with
// debootstrap (into a temporary directory, renamed when complete) when
// this machine has none yet.
func (b *builder) ensureRootfs(ctx context.Context) (string, error) {
	dir := filepath.Join(b.cache, "rootfs-"+rootfsKey(b.suite))
	if _, err := os.Stat(dir); err == nil {
		b.logf("Debian rootfs: cached %s", dir)
		return dir, nil
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return "", fmt.Errorf("debootstrap is not installed: apt-get install debootstrap (it builds the Debian rootfs of the agnhost-family images, once per machine)")
	}
	if os.Geteuid() != 0 {
		return "", fmt.Errorf("debootstrap must run as root to build the Debian rootfs %s: run this once as root (later runs reuse it)", dir)
	}
	tmp := dir + ".tmp"
	if err := safeRemoveAll(tmp); err != nil {
		return "", err
	}
	logPath := filepath.Join(b.cache, "debootstrap.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return "", err
	}
	defer logf.Close()
	args := []string{"--variant=minbase", "--include=" + strings.Join(debianPackages, ","), b.suite, tmp, debianMirror}
	b.logf("Debian rootfs: debootstrap %s (a few minutes; log %s)", strings.Join(args, " "), logPath)
	cmd := exec.CommandContext(ctx, "debootstrap", args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if err := cmd.Run(); err != nil {
		_ = safeRemoveAll(tmp)
		return "", fmt.Errorf("debootstrap %s from %s failed: %v (is %s reachable? see %s):\n%s", b.suite, debianMirror, err, debianMirror, logPath, tail(logPath, 25))
	}
	for _, p := range rootfsTrim {
		full := filepath.Join(tmp, p)
		fi, err := os.Lstat(full)
		if err != nil {
			continue
		}
		if fi.IsDir() {
			ents, _ := os.ReadDir(full)
			for _, e := range ents {
				if err := os.RemoveAll(filepath.Join(full, e.Name())); err != nil {
					return "", err
				}
			}
		} else if err := os.Remove(full); err != nil {
			return "", err
		}
	}
	if err := checkNoMounts(tmp); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	return dir, nil
}

// mountsUnder lists the mount points at or under dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if mp == abs || strings.HasPrefix(mp, abs+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}

func unescapeMount(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

func checkNoMounts(dir string) error {
	mps, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	if len(mps) > 0 {
		return fmt.Errorf("%s still has mounts (%s) after debootstrap; unmount them and run again", dir, strings.Join(mps, ", "))
	}
	return nil
}

// safeRemoveAll removes a debootstrap target that may still have /proc,
// /sys or /dev bind mounts (a run that was stopped): those are unmounted
// first, and nothing is removed while one remains.
func safeRemoveAll(dir string) error {
	if _, err := os.Lstat(dir); os.IsNotExist(err) {
		return nil
	}
	mps, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	for _, mp := range mps {
		_ = syscall.Unmount(mp, syscall.MNT_DETACH)
	}
	if err := checkNoMounts(dir); err != nil {
		return fmt.Errorf("not removing %s: %w", dir, err)
	}
	return os.RemoveAll(dir)
}

// tail returns the last n lines of a file.
func tail(p string, n int) string {
	data, err := os.ReadFile(p)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// rootfsFile finds a file of the rootfs by its path in the image,
// following the rootfs's own symlinks inside it (merged /usr: /bin/x is
// usr/bin/x).
func rootfsFile(root, p string) (string, error) {
	cur := "/"
	parts := strings.Split(strings.Trim(p, "/"), "/")
	for hops := 0; len(parts) > 0; {
		next := filepath.Join(cur, parts[0])
		parts = parts[1:]
		fi, err := os.Lstat(filepath.Join(root, next))
		if err != nil {
			return "", fmt.Errorf("%s in the rootfs: %w", p, err)
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			if hops++; hops > 40 {
				return "", fmt.Errorf("%s in the rootfs: too many symlinks", p)
			}
			target, err := os.Readlink(filepath.Join(root, next))
			if err != nil {
				return "", err
			}
			if !filepath.IsAbs(target) {
				target = filepath.Join(cur, target)
			}
			parts = append(strings.Split(strings.Trim(filepath.Clean(target), "/"), "/"), parts...)
			cur = "/"
			continue
		}
		cur = next
	}
	return filepath.Join(root, cur), nil
}
