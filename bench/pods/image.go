package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/k3sm-dev/k3sm/internal/runtime/imagetest"
)

// serveImage builds the runtime's test program (imagetest.ProgSource, a
// static Go binary), packs it as an OCI image for this host and serves it
// from a registry on 127.0.0.1. It returns the image reference.
func serveImage(dir string) (ref string, stop func(), err error) {
	prog, err := imagetest.BuildProg(dir)
	if err != nil {
		return "", nil, err
	}
	img, err := imagetest.Image(prog, v1.Platform{})
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: registry.New(registry.Logger(log.New(io.Discard, "", 0)))}
	go srv.Serve(ln)
	stop = func() { srv.Close() }
	ref = ln.Addr().String() + "/bench/prog:v1"
	tag, err := name.ParseReference(ref)
	if err == nil {
		err = remote.Write(tag, img)
	}
	if err != nil {
		stop()
		return "", nil, fmt.Errorf("push %s: %w", ref, err)
	}
	return ref, stop, nil
}

// pushPause packs the pause program (klimax's, internal/klimax/nodeimage/cmd/pause)
// as the peer's sandbox image and pushes it to the loopback registry.
func pushPause(registry, bin string) (string, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return "", err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "pause", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(data)), ModTime: time.Unix(1700000000, 0)})
	tw.Write(data)
	if err := tw.Close(); err != nil {
		return "", err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return "", err
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		return "", err
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return "", err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = runtime.GOOS, runtime.GOARCH
	cf.Config.Entrypoint = []string{"/pause"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return "", err
	}
	ref := registry + "/bench/pause:v1"
	tag, err := name.ParseReference(ref)
	if err == nil {
		err = remote.Write(tag, img)
	}
	if err != nil {
		return "", fmt.Errorf("push %s: %w", ref, err)
	}
	return ref, nil
}
