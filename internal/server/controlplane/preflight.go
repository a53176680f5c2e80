package controlplane

import (
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/syserr"
)

// Preflight checks what needs the system (directories, ports, the data-dir
// lock) and returns a release function for the lock. Errors name the flag.
func Preflight(cfg *Config) (release func(), err error) {
	if err := ensureWritableDir(cfg.DataDir); err != nil {
		return nil, &FieldError{Flag: "data-dir", Value: cfg.DataDir, Problem: "not writable: " + err.Error(),
			Fix: "run as root for /var/lib/k3sm or pass --data-dir under your home"}
	}
	l := datadir.New(cfg.DataDir)
	release, err = datadir.Lock(l.LockFile(), "server")
	if err != nil {
		return nil, &FieldError{Flag: "data-dir", Value: cfg.DataDir, Problem: err.Error(),
			Fix: "stop that server first, or pass another --data-dir"}
	}
	for _, d := range []string{l.ServerDir(), l.DBDir(), l.TLSDir(), l.CredDir(), l.LogDir(), l.RunDir(), l.FlexVolumeDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			release()
			return nil, err
		}
		// MkdirAll keeps the mode of directories that exist; tighten them.
		if err := os.Chmod(d, 0o700); err != nil {
			release()
			return nil, err
		}
	}
	if sock := l.KineSocket(); len(sock) > 100 {
		release()
		return nil, &FieldError{Flag: "data-dir", Value: cfg.DataDir, Problem: "too long for unix socket paths (" + strconv.Itoa(len(sock)) + " bytes)", Fix: "use a shorter path"}
	}
	ports := []struct {
		flag string
		host string
		port int
	}{
		{"https-listen-port", cfg.BindAddress, cfg.HTTPSPort},
		{"scheduler-port", "127.0.0.1", cfg.SchedulerPort},
		{"controller-manager-port", "127.0.0.1", cfg.ControllerManagerPort},
		{"kubelet-port", cfg.NodeIP, cfg.KubeletPort},
		{"supervisor-port", cfg.BindAddress, cfg.SupervisorPort},
	}
	for _, p := range ports {
		if p.port == 0 { // --supervisor-port=0: off
			continue
		}
		addr := net.JoinHostPort(p.host, strconv.Itoa(p.port))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			release()
			return nil, &FieldError{Flag: p.flag, Value: strconv.Itoa(p.port), Problem: fmt.Sprintf("cannot listen on %s: %v", addr, syserr.Cause(err)),
				Fix: "stop what uses it or choose another port with --" + p.flag}
		}
		ln.Close()
	}
	// The mesh device's UDP port, taken later by the netd this server
	// starts (as root); a netd run apart (--netd-socket) holds it across
	// server restarts, so it is not ours to check then.
	if cfg.MeshPort != 0 && cfg.NetdSocket == "" && cfg.PodNetwork != "host" && os.Geteuid() == 0 {
		addr := net.JoinHostPort("0.0.0.0", strconv.Itoa(cfg.MeshPort))
		pc, err := net.ListenPacket("udp4", addr)
		if err != nil {
			release()
			return nil, &FieldError{Flag: "mesh-port", Value: strconv.Itoa(cfg.MeshPort), Problem: fmt.Sprintf("cannot listen on UDP %s: %v", addr, syserr.Cause(err)),
				Fix: "stop what uses it (another k3sm or WireGuard on this machine?) or choose another port with --mesh-port, or 0 for no mesh"}
		}
		pc.Close()
	}
	return release, nil
}

func ensureWritableDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return syserr.Cause(err)
	}
	f, err := os.CreateTemp(dir, ".write-test-*")
	if err != nil {
		return syserr.Cause(err)
	}
	f.Close()
	return os.Remove(f.Name())
}
