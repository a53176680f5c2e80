package daemon

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/runtime/image"
)

// ErrDaemonRunning: a runtime daemon holds the data dir; talk to its socket.
var ErrDaemonRunning = errors.New("a runtime daemon serves this data dir")

// ServeImagesOffline serves the Images service of a data dir whose runtime
// daemon is stopped, on a private socket, holding the daemon's lock so the
// store keeps one writer (a daemon that starts meanwhile waits for it to
// be released, failing with "another daemon"). No pod runs, so none uses
// an image. It returns ErrDaemonRunning when the daemon holds the lock.
func ServeImagesOffline(dataDir, registriesFile string) (socket string, stop func(), err error) {
	dirs := datadir.New(dataDir)
	if err := os.MkdirAll(dirs.RunDir(), 0o700); err != nil {
		return "", nil, err
	}
	lock, err := os.OpenFile(dirs.RuntimeLock(), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return "", nil, err
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		return "", nil, ErrDaemonRunning
	}
	fail := func(err error) (string, func(), error) {
		lock.Close()
		return "", nil, err
	}
	regs, err := image.LoadRegistries(registriesFile)
	if err != nil {
		return fail(err)
	}
	store, err := image.NewStore(dirs.ImagesDir(), regs)
	if err != nil {
		return fail(err)
	}
	tmp, err := os.MkdirTemp("", "k3sm-images-")
	if err != nil {
		return fail(err)
	}
	socket = filepath.Join(tmp, "images.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		os.RemoveAll(tmp)
		return fail(fmt.Errorf("image store: %w", err))
	}
	g := grpc.NewServer()
	runtimev1.RegisterImagesServer(g, &imagesServer{store: store})
	go g.Serve(ln)
	return socket, func() {
		g.Stop()
		os.RemoveAll(tmp)
		lock.Close()
	}, nil
}
