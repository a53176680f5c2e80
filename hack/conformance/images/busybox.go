//go:build linux

package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// The busybox images carry busybox built from its release, as upstream's
// (docker.io/library/busybox) is, not Debian's busybox-static: Debian
// patches ash to drop environment variables whose names are not shell
// identifiers (its revert-9c143ce52... patch), and "[sig-node] ConfigMap
// should be consumable via the environment" expects `sh -c env` to print
// data-1=value-1. The tarball is the orig tarball of Debian's busybox
// source package (the release itself, busybox.net's sha256), from the one
// mirror this machine reaches.
const (
	busyboxVersion = "1.37.0"
	busyboxURL     = debianMirror + "/pool/main/b/busybox/busybox_" + busyboxVersion + ".orig.tar.bz2"
	busyboxSHA256  = "3311dff32e746499f4df0d5df04d7eb396382d7e108bb9250e7b519b837043a4"
	// busyboxDate (the release tarball's, 2024-09-26) is the build date
	// the binary prints, so every machine builds the same binary.
	busyboxDate = "1727386272"
	// busyboxBuild is bumped when busyboxConfig or the build changes.
	busyboxBuild = "1"
)

// busyboxConfig is what is changed in upstream's defconfig (on or off).
func busyboxConfig() map[string]bool {
	c := map[string]bool{
		"CONFIG_STATIC": true,
		// tc does not compile against the headers of Linux 6.8 and later
		// (trixie's: CBQ is gone) and no conformance spec runs it.
		"CONFIG_TC": false,
	}
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "386" {
		// x86 only; 1.37.0 does not compile elsewhere with it.
		c["CONFIG_SHA1_HWACCEL"] = false
	}
	return c
}

// ensureBusybox returns the cached static busybox binary, building it
// (into a temporary directory, renamed when complete) when this machine
// has none yet.
func (b *builder) ensureBusybox(ctx context.Context) (string, error) {
	dir := filepath.Join(b.cache, "busybox", fmt.Sprintf("%s-b%s-%s", busyboxVersion, busyboxBuild, runtime.GOARCH))
	bin := filepath.Join(dir, "busybox")
	if _, err := os.Stat(bin); err == nil {
		b.logf("busybox %s: cached %s", busyboxVersion, bin)
		return bin, nil
	}
	const hint = "building busybox needs gcc, make, bzip2 and libc6-dev (static libc): apt-get install gcc make bzip2 libc6-dev"
	for _, tool := range []string{"gcc", "make", "bzip2", "tar"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "", fmt.Errorf("%s is not installed; %s", tool, hint)
		}
	}
	if out, _ := exec.Command("gcc", "-print-file-name=libc.a").Output(); !filepath.IsAbs(strings.TrimSpace(string(out))) {
		return "", fmt.Errorf("gcc finds no libc.a; %s", hint)
	}
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return "", err
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)

	t := now()
	b.logf("busybox %s: downloading %s", busyboxVersion, busyboxURL)
	if err := download(ctx, busyboxURL, busyboxSHA256, filepath.Join(tmp, "busybox.tar.bz2")); err != nil {
		return "", err
	}
	logPath := filepath.Join(b.cache, "busybox-build.log")
	b.logf("busybox %s: downloaded in %s; make defconfig, static, make -j%d busybox (log %s)", busyboxVersion, since(t), runtime.NumCPU(), logPath)
	t = now()
	logf, err := os.Create(logPath)
	if err != nil {
		return "", err
	}
	defer logf.Close()
	src := filepath.Join(tmp, "busybox-"+busyboxVersion)
	run := func(dir string, args ...string) error {
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Dir, cmd.Stdout, cmd.Stderr = dir, logf, logf
		cmd.Env = append(os.Environ(), "LC_ALL=C", "SOURCE_DATE_EPOCH="+busyboxDate)
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("busybox %s: %s failed: %v (%s; see %s):\n%s", busyboxVersion, strings.Join(args, " "), err, hint, logPath, tail(logPath, 25))
		}
		return nil
	}
	if err := run(tmp, "tar", "-xjf", "busybox.tar.bz2"); err != nil {
		return "", err
	}
	if err := run(src, "make", "defconfig"); err != nil {
		return "", err
	}
	config := filepath.Join(src, ".config")
	data, err := os.ReadFile(config)
	if err != nil {
		return "", err
	}
	cfg, err := setConfig(string(data), busyboxConfig())
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(config, []byte(cfg), 0o644); err != nil {
		return "", err
	}
	if err := run(src, "make", fmt.Sprintf("-j%d", runtime.NumCPU()), "busybox"); err != nil {
		return "", err
	}
	// The build completes .config (dependent options): ours must stay.
	if data, err = os.ReadFile(config); err != nil {
		return "", err
	}
	if cfg, _ := setConfig(string(data), busyboxConfig()); cfg != string(data) {
		return "", fmt.Errorf("busybox %s: the build did not keep the options %v in %s", busyboxVersion, busyboxConfig(), config)
	}
	// What it is built for: ash passes data-1 on to the commands it runs.
	check := exec.CommandContext(ctx, filepath.Join(src, "busybox"), "sh", "-c", `exec "$0" env`, filepath.Join(src, "busybox"))
	check.Env = []string{"data-1=value-1"}
	out, err := check.Output()
	if err != nil {
		return "", fmt.Errorf("busybox %s: running it: %v", busyboxVersion, err)
	}
	if !strings.Contains("\n"+string(out), "\ndata-1=value-1\n") {
		return "", fmt.Errorf("busybox %s: `sh -c env` does not print data-1=value-1 (its environment):\n%s", busyboxVersion, out)
	}
	// The binary, and its .config for reference.
	for from, to := range map[string]string{"busybox": "busybox", ".config": "busybox.config"} {
		if err := os.Rename(filepath.Join(src, from), filepath.Join(tmp, to)); err != nil {
			return "", err
		}
	}
	for _, f := range []string{src, filepath.Join(tmp, "busybox.tar.bz2")} {
		if err := os.RemoveAll(f); err != nil {
			return "", err
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	b.logf("busybox %s: built in %s", busyboxVersion, since(t))
	return bin, nil
}

// setConfig turns the options of opts on or off in a busybox .config.
func setConfig(config string, opts map[string]bool) (string, error) {
	lines := strings.Split(config, "\n")
	for name, on := range opts {
		want, found := "# "+name+" is not set", false
		if on {
			want = name + "=y"
		}
		for i, l := range lines {
			if l == name+"=y" || l == "# "+name+" is not set" {
				lines[i], found = want, true
			}
		}
		if !found {
			return "", fmt.Errorf("busybox .config has no %s", name)
		}
	}
	return strings.Join(lines, "\n"), nil
}

// download fetches url into dst, checking its sha256.
func download(ctx context.Context, url, sum, dst string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("downloading %s: %w (is %s reachable?)", url, err, debianMirror)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("downloading %s: %s", url, resp.Status)
	}
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	h := sha256.New()
	_, err = io.Copy(io.MultiWriter(f, h), resp.Body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("downloading %s: %w", url, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sum {
		return fmt.Errorf("downloading %s: sha256 %s, want %s", url, got, sum)
	}
	return nil
}
