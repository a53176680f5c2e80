package vmtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
)

// ShareLabel and ShareDir: the caller's shared directory, in the guest.
const (
	ShareLabel = "k3sm-share"
	ShareDir   = "/mnt/k3sm"
)

// Options of one boot.
type Options struct {
	// Share is the host directory the guest sees read-only at ShareDir: its
	// content when Boot is called, on a disk image made then.
	Share string
	// Work holds the disk overlay and the console log.
	Work string
	// MemoryMB and CPUs of the guest: 2048 and 2 when 0.
	MemoryMB, CPUs int
	// BootTimeout bounds the wait for ssh after a (re)boot: 3 minutes when 0
	// (TCG boots take one or two).
	BootTimeout time.Duration
}

// VM is a running guest.
type VM struct {
	img     *Image
	opts    Options
	port    int
	Console string // the serial console's log
	Accel   string // "kvm" or "tcg"
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error

	mu     sync.Mutex
	client *ssh.Client
}

// KVM reports whether the guest can run under KVM: /dev/kvm opens for
// read and write and the CPU advertises vmx or svm. Some sandboxes expose a
// /dev/kvm whose vCPUs never run a guest (seen on this project's build
// machines: QEMU aborts setting MSR 0x10a, or hangs before the kernel's
// first line), and their CPUs advertise neither. $K3SM_VM_ACCEL (kvm or
// tcg) overrides.
func KVM() bool {
	switch os.Getenv("K3SM_VM_ACCEL") {
	case "kvm":
		return true
	case "tcg":
		return false
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false
	}
	f.Close()
	info, _ := os.ReadFile("/proc/cpuinfo")
	for _, line := range strings.Split(string(info), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "flags" {
			f := " " + v + " "
			return strings.Contains(f, " vmx ") || strings.Contains(f, " svm ")
		}
	}
	return false
}

// Boot starts the guest on a qcow2 overlay of img's disk and waits until
// its ssh answers.
func Boot(ctx context.Context, img *Image, opts Options) (*VM, error) {
	if opts.MemoryMB == 0 {
		opts.MemoryMB = 2048
	}
	if opts.CPUs == 0 {
		opts.CPUs = 2
	}
	if opts.BootTimeout == 0 {
		opts.BootTimeout = 3 * time.Minute
	}
	overlay := filepath.Join(opts.Work, "overlay.qcow2")
	if out, err := exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", img.Disk, overlay).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("qemu-img create: %w: %s", err, out)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	v := &VM{img: img, opts: opts, port: port, Console: filepath.Join(opts.Work, "console.log"), Accel: "tcg", done: make(chan struct{})}
	accel, cpu := "tcg,thread=multi", "max"
	if KVM() {
		v.Accel, accel, cpu = "kvm", "kvm", "host"
	}
	args := []string{
		"-machine", "q35", "-accel", accel, "-cpu", cpu,
		"-m", strconv.Itoa(opts.MemoryMB), "-smp", strconv.Itoa(opts.CPUs),
		"-kernel", img.Kernel, "-initrd", img.Initrd,
		// Debian 12 boots the unified hierarchy by default; said anyway so
		// the guest stays the host the tests are about.
		"-append", "root=/dev/vda rw console=ttyS0 systemd.unified_cgroup_hierarchy=1 net.ifnames=1 panic=-1",
		"-drive", "file=" + overlay + ",if=virtio,format=qcow2,discard=unmap",
		"-netdev", fmt.Sprintf("user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:%d-:22", port),
		"-device", "virtio-net-pci,netdev=n0",
		"-display", "none", "-monitor", "none", "-serial", "file:" + v.Console,
	}
	if opts.Share != "" {
		disk, err := shareDisk(ctx, opts.Share, opts.Work)
		if err != nil {
			return nil, err
		}
		args = append(args, "-drive", "file="+disk+",if=virtio,format=raw,readonly=on")
	}
	v.cmd = exec.Command("qemu-system-x86_64", args...)
	var qerr bytes.Buffer
	v.cmd.Stdout, v.cmd.Stderr = &qerr, &qerr
	if err := v.cmd.Start(); err != nil {
		return nil, fmt.Errorf("qemu-system-x86_64: %w", err)
	}
	go func() {
		v.waitErr = v.cmd.Wait()
		if qerr.Len() > 0 {
			v.waitErr = fmt.Errorf("%v: %s", v.waitErr, strings.TrimSpace(qerr.String()))
		}
		close(v.done)
	}()
	if err := v.waitSSH(ctx, ""); err != nil {
		v.Stop()
		return nil, err
	}
	return v, nil
}

// BootID is the guest's /proc/sys/kernel/random/boot_id.
func (v *VM) BootID(ctx context.Context) (string, error) {
	out, err := v.Output(ctx, "cat /proc/sys/kernel/random/boot_id")
	return strings.TrimSpace(out), err
}

// waitSSH dials until the guest answers with a boot other than notBoot.
func (v *VM) waitSSH(ctx context.Context, notBoot string) error {
	deadline := time.Now().Add(v.opts.BootTimeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-v.done:
			return fmt.Errorf("qemu exited during boot (%v); console: %s", v.waitErr, v.consoleTail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
		c, err := v.dial()
		if err != nil {
			last = err
			continue
		}
		v.mu.Lock()
		v.client = c
		v.mu.Unlock()
		id, err := v.BootID(ctx)
		if err == nil && id != notBoot {
			return nil
		}
		c.Close()
		last = fmt.Errorf("still the boot %s", notBoot)
	}
	return fmt.Errorf("the guest's ssh did not answer within %s (%v); console: %s", v.opts.BootTimeout, last, v.consoleTail())
}

func (v *VM) dial() (*ssh.Client, error) {
	return ssh.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", v.port), &ssh.ClientConfig{
		User: "root",
		Auth: []ssh.AuthMethod{ssh.PublicKeys(v.img.signer)},
		// The guest was made by this package and is reached on loopback.
		HostKeyCallback: ssh.InsecureIgnoreHostKey(),
		Timeout:         5 * time.Second,
	})
}

// Run runs a shell script as root in the guest, its stdout to stdout and
// its stderr to stderr (either may be nil: discarded; the same writer for
// both is serialized). A non-zero exit is an error (*ssh.ExitError).
func (v *VM) Run(ctx context.Context, script string, stdout, stderr io.Writer) error {
	s, err := v.session(ctx)
	if err != nil {
		return err
	}
	defer s.Close()
	if stdout != nil && stdout == stderr {
		// The session copies the two streams in two goroutines: one writer
		// needs a lock (and no ReadFrom, which bytes.Buffer would race in).
		w := &lockedWriter{w: stdout}
		stdout, stderr = w, w
	}
	s.Stdout, s.Stderr = stdout, stderr
	done := make(chan error, 1)
	go func() { done <- s.Run(script) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		s.Signal(ssh.SIGKILL)
		return ctx.Err()
	}
}

// session opens a session on the connection, dialing again once when the
// connection is gone (EOF: the guest rebooted, or sshd restarted), so one
// lost connection does not fail every later call. A guest that rebooted
// on its own is a bug to find: the new boot and the console's tail are
// logged to stderr.
func (v *VM) session(ctx context.Context) (*ssh.Session, error) {
	v.mu.Lock()
	c := v.client
	v.mu.Unlock()
	if c == nil {
		return nil, errors.New("the guest is not up")
	}
	s, err := c.NewSession()
	if err == nil {
		return s, nil
	}
	first := err
	deadline := time.Now().Add(2 * time.Minute)
	for {
		select {
		case <-v.done:
			return nil, fmt.Errorf("%v, and qemu exited (%v); console: %s", first, v.waitErr, v.consoleTail())
		case <-ctx.Done():
			return nil, fmt.Errorf("%v; reconnecting: %w", first, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
		nc, err := v.dial()
		if err == nil {
			if s, err = nc.NewSession(); err == nil {
				v.mu.Lock()
				old := v.client
				v.client = nc
				v.mu.Unlock()
				if old != nil {
					old.Close()
				}
				fmt.Fprintf(os.Stderr, "vmtest: the ssh connection to the guest was lost (%v) and made again; console: %s\n", first, v.consoleTail())
				return s, nil
			}
			nc.Close()
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%v; reconnecting for 2m: %v; console: %s", first, err, v.consoleTail())
		}
	}
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Output runs script and returns its combined output.
func (v *VM) Output(ctx context.Context, script string) (string, error) {
	var b bytes.Buffer
	err := v.Run(ctx, script, &b, &b)
	return b.String(), err
}

// Reboot reboots the guest (QEMU boots the same kernel again) and waits
// for the new boot's ssh.
func (v *VM) Reboot(ctx context.Context) error {
	id, err := v.BootID(ctx)
	if err != nil {
		return err
	}
	// The connection drops as the guest goes down: the error is expected.
	_ = v.Run(ctx, "systemctl reboot", nil, nil)
	v.mu.Lock()
	v.client.Close()
	v.client = nil
	v.mu.Unlock()
	return v.waitSSH(ctx, id)
}

// Stop powers the guest off, killing QEMU when it does not end in 30 s.
func (v *VM) Stop() {
	v.mu.Lock()
	c := v.client
	v.client = nil
	v.mu.Unlock()
	if c != nil {
		s, err := c.NewSession()
		if err == nil {
			s.Start("systemctl poweroff")
		}
		select {
		case <-v.done:
		case <-time.After(30 * time.Second):
		}
		c.Close()
	}
	select {
	case <-v.done:
	default:
		v.cmd.Process.Kill()
		<-v.done
	}
}

func (v *VM) consoleTail() string {
	b, _ := os.ReadFile(v.Console)
	return "\n" + tail(b, 30)
}

// shareDisk makes an ext4 image of dir, sized for its content.
func shareDisk(ctx context.Context, dir, work string) (string, error) {
	var size int64
	err := filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil {
			size += fi.Size() + 4096
		}
		return err
	})
	if err != nil {
		return "", err
	}
	disk := filepath.Join(work, "share.img")
	mb := size*5/4>>20 + 64
	if out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-L", ShareLabel, "-d", dir, disk, fmt.Sprintf("%dM", mb)).CombinedOutput(); err != nil {
		return "", fmt.Errorf("mkfs.ext4 of the shared directory %s: %w: %s", dir, err, out)
	}
	return disk, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
