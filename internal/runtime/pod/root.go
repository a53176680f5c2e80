package pod

// A container's root, prepared before each attempt: in the sandbox the
// image is its "/" (overlay upper and work directories here, nothing
// copied); outside it a copy-on-write clone of the image; for image
// "native" a private directory.

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/k3sm-dev/k3sm/internal/runtime/clone"
	"github.com/k3sm-dev/k3sm/internal/runtime/sandbox"
)

// prepareRoot makes the attempt's root and, in the sandbox, its sandbox
// input (a.box). A *refusedError: the sandbox refuses the container.
func (p *managedPod) prepareRoot(a *attempt) error {
	c, img, spec, cspec, root := a.c, a.img, a.spec, a.cspec, a.root
	// In the sandbox the image is the container's "/" (an overlay: nothing
	// is copied; each attempt starts from the image, as a new container
	// does). Otherwise the container's root is a copy-on-write clone of
	// the image, kept across restarts of the same image.
	if a.boxed {
		if msg := refusal(spec, cspec); msg != "" {
			return &refusedError{msg}
		}
		id, err := containerIdentity(spec, cspec, img)
		if err != nil {
			return &refusedError{err.Error()}
		}
		base, err := p.idRangeBase()
		if err != nil {
			return err
		}
		if img == nil {
			// The native container's private directory (at nativeRoot
			// in the sandbox), its own: kept across restarts, as before.
			if err := os.MkdirAll(root, 0o700); err != nil {
				return err
			}
			if sandbox.Rootless() {
				// Already the pod root's: the runtime's own.
			} else if err := os.Chown(root, int(base), int(base)); err != nil {
				return err
			}
			os.Chmod(root, 0o777|os.ModeSticky)
		} else {
			os.RemoveAll(root)
			if err := os.MkdirAll(root, 0o700); err != nil {
				return err
			}
		}
		a.box = sandboxInput{Pod: spec, Container: cspec, PodDir: p.dir, Root: root, Native: img == nil, Image: img, IDBase: base,
			Upper: filepath.Join(root, "upper"), Work: filepath.Join(root, "work"), Hostname: podHostname(spec), Identity: id,
			SeccompDir: p.m.dirs().SeccompDir()}
	} else if img == nil {
		if err := os.MkdirAll(root, 0o755); err != nil {
			return err
		}
	} else if a.rootImage != img.ID {
		os.RemoveAll(root)
		os.MkdirAll(filepath.Dir(root), 0o700)
		if _, err := clone.Tree(img.RootFS, root); err != nil {
			return fmt.Errorf("materialize pod root: %w", err)
		}
		p.update(func() { c.rootImage = img.ID })
	}
	return nil
}
