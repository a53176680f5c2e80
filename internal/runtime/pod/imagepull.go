package pod

// Images: pull policies, ImagePullBackOff, and the image id a container
// reports.

import (
	"context"
	"fmt"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/image"
)

// repoDigestFor picks the image's repo digest for the reference the pod
// used (kubelet's imageID), falling back to the image id.
func repoDigestFor(img *image.Image, ref string) string {
	if r, err := image.ParseRef(ref); err == nil {
		repo := r.Context().Name()
		for _, d := range img.RepoDigests {
			if len(d) > len(repo) && d[:len(repo)] == repo && d[len(repo)] == '@' {
				return d
			}
		}
	}
	if len(img.RepoDigests) > 0 {
		return img.RepoDigests[0]
	}
	return img.ID
}

// ensureImage applies the pull policy, retrying failed pulls with
// ImagePullBackOff. It returns nil for image "native".
func (p *managedPod) ensureImage(ctx context.Context, c *container) (*image.Image, string, outcome, bool) {
	p.mu.Lock()
	ref := c.spec.GetImage()
	policy := c.spec.GetImagePullPolicy()
	secrets := p.spec.GetPullSecrets()
	name := c.name
	p.mu.Unlock()
	if ref == NativeImage {
		return nil, ref, 0, true
	}
	setWaiting := func(reason, msg string) {
		p.update(func() { c.state = containerState{Waiting: &waiting{Reason: reason, Message: msg}} })
	}
	if _, err := image.ParseRef(ref); err != nil {
		msg := fmt.Sprintf("Failed to apply default image tag %q: couldn't parse image name %q: %v", ref, ref, err)
		setWaiting("InvalidImageName", msg)
		p.event(warning, "InspectFailed", name, msg)
		p.event(warning, "Failed", name, "Error: InvalidImageName")
		for {
			if out, ok := p.sleep(ctx, c, time.Hour); !ok {
				return nil, ref, out, false
			}
		}
	}
	if policy == runtimev1.PullPolicy_PULL_POLICY_UNSPECIFIED {
		policy = runtimev1.PullPolicy_PULL_POLICY_IF_NOT_PRESENT
		if image.DefaultPullAlways(ref) {
			policy = runtimev1.PullPolicy_PULL_POLICY_ALWAYS
		}
	}
	for {
		img, present := p.m.cfg.Images.Lookup(ref)
		var reason, msg string
		switch {
		case policy == runtimev1.PullPolicy_PULL_POLICY_NEVER && !present:
			reason = "ErrImageNeverPull"
			msg = fmt.Sprintf("Container image %q is not present with pull policy of Never", ref)
			p.event(warning, "ErrImageNeverPull", name, msg)
		case present && policy != runtimev1.PullPolicy_PULL_POLICY_ALWAYS:
			p.event(normal, "Pulled", name, fmt.Sprintf("Container image %q already present on machine", ref))
			c.pullBackOff.Reset()
			return img, ref, 0, true
		default:
			p.event(normal, "Pulling", name, fmt.Sprintf("Pulling image %q", ref))
			pctx, cancel := context.WithCancel(ctx)
			stop := context.AfterFunc(ctx, cancel)
			go func() {
				select {
				case <-c.stopc:
					cancel()
				case <-pctx.Done():
				}
			}()
			t0 := time.Now()
			pulled, err := p.m.cfg.Images.Pull(pctx, ref, secrets)
			stop()
			cancel()
			if err == nil {
				p.event(normal, "Pulled", name, fmt.Sprintf("Successfully pulled image %q in %s. Image size: %d bytes.", ref, time.Since(t0).Round(time.Millisecond), pulled.Size))
				c.pullBackOff.Reset()
				return pulled, ref, 0, true
			}
			select {
			case <-c.stopc:
				return nil, ref, outStopped, false
			default:
			}
			if ctx.Err() != nil {
				return nil, ref, outDetached, false
			}
			reason, msg = "ErrImagePull", err.Error()
			p.event(warning, "Failed", name, fmt.Sprintf("Failed to pull image %q: %s", ref, msg))
			p.event(warning, "Failed", name, "Error: ErrImagePull")
		}
		setWaiting(reason, msg)
		d := c.pullBackOff.Next()
		if reason == "ErrImagePull" {
			// The kubelet reports ErrImagePull until its next sync, then
			// ImagePullBackOff while the back-off runs.
			first := min(d/2, time.Second)
			if out, ok := p.sleep(ctx, c, first); !ok {
				return nil, ref, out, false // a definition change retries at once
			}
			d -= first
			bmsg := fmt.Sprintf("Back-off pulling image %q: ErrImagePull: %s", ref, msg)
			setWaiting("ImagePullBackOff", bmsg)
			p.event(normal, "BackOff", name, fmt.Sprintf("Back-off pulling image %q", ref))
			p.event(warning, "Failed", name, "Error: ImagePullBackOff")
		}
		if out, ok := p.sleep(ctx, c, d); !ok {
			return nil, ref, out, false
		}
	}
}
