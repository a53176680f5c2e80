package main

import (
	"fmt"
	"io"
	"log"
	"net"
	"net/http"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

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
