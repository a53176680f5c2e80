package daemon

import (
	"errors"
	"io"
	"os"
	"sort"
	"strings"

	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/image"
)

// imageError maps store errors onto gRPC codes the CLI and provider act on.
func imageError(err error) error {
	var ie *image.InvalidNameError
	var pe *image.PlatformError
	switch {
	case errors.As(err, &ie):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.As(err, &pe):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, os.ErrNotExist):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Unknown, err.Error())
}

// usedBy maps image ids to the pods (namespace/name) that run them or
// name them in their spec.
func (s *imagesServer) usedBy() map[string][]string {
	out := map[string][]string{}
	if s.pods == nil {
		return out
	}
	statuses, specs := s.pods()
	add := func(id, pod string) {
		for _, p := range out[id] {
			if p == pod {
				return
			}
		}
		out[id] = append(out[id], pod)
	}
	for _, st := range statuses {
		pod := st.GetNamespace() + "/" + st.GetName()
		for _, c := range append(st.GetInitContainerStatuses(), st.GetContainerStatuses()...) {
			if c.GetImageDigest() != "" {
				add(c.GetImageDigest(), pod)
			}
		}
	}
	for _, sp := range specs {
		pod := sp.GetNamespace() + "/" + sp.GetName()
		for _, c := range append(sp.GetInitContainers(), sp.GetContainers()...) {
			if img, ok := s.store.Lookup(c.GetImage()); ok {
				add(img.ID, pod)
			}
		}
	}
	for _, pods := range out {
		sort.Strings(pods)
	}
	return out
}

func (s *imagesServer) PullImageProgress(req *runtimev1.PullImageRequest, stream grpc.ServerStreamingServer[runtimev1.ImageProgress]) error {
	img, err := s.store.PullProgress(stream.Context(), req.GetImage(), req.GetPullSecrets(), func(done, total int64) {
		stream.Send(&runtimev1.ImageProgress{DoneBytes: done, TotalBytes: total})
	})
	if err != nil {
		return imageError(err)
	}
	return stream.Send(&runtimev1.ImageProgress{Image: imageProto(img)})
}

func (s *imagesServer) LoadImage(stream grpc.ClientStreamingServer[runtimev1.LoadImageRequest, runtimev1.LoadImageResponse]) error {
	f, err := os.CreateTemp(s.store.TempDir(), "load-*.tar")
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	defer os.Remove(f.Name())
	defer f.Close()
	var tags []string
	for {
		m, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		tags = append(tags, m.GetTags()...)
		if _, err := f.Write(m.GetChunk()); err != nil {
			return status.Error(codes.Internal, err.Error())
		}
	}
	if err := f.Close(); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	imgs, err := s.store.Load(stream.Context(), f.Name(), tags)
	if err != nil {
		if code := status.Code(imageError(err)); code != codes.Unknown {
			return imageError(err)
		}
		return status.Error(codes.InvalidArgument, err.Error())
	}
	resp := &runtimev1.LoadImageResponse{}
	for _, img := range imgs {
		resp.Images = append(resp.Images, imageProto(img))
	}
	return stream.SendAndClose(resp)
}

// chunkWriter sends what is written as SaveImage chunks.
type chunkWriter struct {
	stream grpc.ServerStreamingServer[runtimev1.SaveImageResponse]
}

func (w chunkWriter) Write(b []byte) (int, error) {
	const max = 1 << 20
	for off := 0; off < len(b); off += max {
		end := min(off+max, len(b))
		if err := w.stream.Send(&runtimev1.SaveImageResponse{Chunk: append([]byte(nil), b[off:end]...)}); err != nil {
			return off, err
		}
	}
	return len(b), nil
}

func (s *imagesServer) SaveImage(req *runtimev1.SaveImageRequest, stream grpc.ServerStreamingServer[runtimev1.SaveImageResponse]) error {
	if len(req.GetImages()) == 0 {
		return status.Error(codes.InvalidArgument, "name at least one image to save")
	}
	for _, ref := range req.GetImages() {
		if _, ok := s.store.Resolve(ref); !ok {
			return status.Errorf(codes.NotFound, "image %q is not in the store (see `k3sm image ls`)", ref)
		}
	}
	if err := s.store.Save(chunkWriter{stream}, req.GetImages()); err != nil {
		return imageError(err)
	}
	return nil
}

func (s *imagesServer) PushImage(req *runtimev1.PushImageRequest, stream grpc.ServerStreamingServer[runtimev1.ImageProgress]) error {
	err := s.store.Push(stream.Context(), req.GetImage(), req.GetTarget(), func(done, total int64) {
		stream.Send(&runtimev1.ImageProgress{DoneBytes: done, TotalBytes: total})
	})
	if err != nil {
		return imageError(err)
	}
	img, _ := s.store.Resolve(req.GetImage())
	return stream.Send(&runtimev1.ImageProgress{Image: imageProto(img)})
}

func (s *imagesServer) TagImage(ctx context.Context, req *runtimev1.TagImageRequest) (*runtimev1.TagImageResponse, error) {
	img, err := s.store.Tag(req.GetSource(), req.GetTarget())
	if err != nil {
		return nil, imageError(err)
	}
	return &runtimev1.TagImageResponse{Image: imageProto(img)}, nil
}

func (s *imagesServer) UntagImage(ctx context.Context, req *runtimev1.UntagImageRequest) (*runtimev1.UntagImageResponse, error) {
	var inUse func(string) error
	if !req.GetForce() {
		used := s.usedBy()
		inUse = func(id string) error {
			if pods := used[id]; len(pods) > 0 {
				return status.Errorf(codes.FailedPrecondition, "image %s is used by pod %s: delete the pod first, or pass --force (the running pod keeps its copy; a restart would need the image again)",
					req.GetImage(), strings.Join(pods, ", "))
			}
			return nil
		}
	}
	deleted, err := s.store.Untag(req.GetImage(), inUse)
	if err != nil {
		if _, ok := status.FromError(err); ok && status.Code(err) != codes.Unknown {
			return nil, err
		}
		return nil, imageError(err)
	}
	return &runtimev1.UntagImageResponse{Deleted: deleted}, nil
}

func (s *imagesServer) InspectImage(ctx context.Context, req *runtimev1.InspectImageRequest) (*runtimev1.InspectImageResponse, error) {
	img, ok := s.store.Resolve(req.GetImage())
	if !ok {
		return nil, status.Errorf(codes.NotFound, "image %q is not in the store (see `k3sm image ls`)", req.GetImage())
	}
	m, c, err := s.store.ManifestOf(img.ID)
	if err != nil {
		return nil, imageError(err)
	}
	p := imageProto(img)
	p.UsedBy = s.usedBy()[img.ID]
	return &runtimev1.InspectImageResponse{Image: p, Manifest: m, Config: c}, nil
}

func (s *imagesServer) PruneImages(ctx context.Context, req *runtimev1.PruneImagesRequest) (*runtimev1.PruneImagesResponse, error) {
	used := s.usedBy()
	res, err := s.store.Prune(func(img *image.Image) bool {
		return len(used[img.ID]) > 0 || (req.GetDanglingOnly() && len(img.RepoTags) > 0)
	}, req.GetDryRun())
	if err != nil {
		return nil, imageError(err)
	}
	resp := &runtimev1.PruneImagesResponse{FreedBytes: res.Freed}
	for _, img := range res.Removed {
		resp.Removed = append(resp.Removed, imageProto(img))
	}
	return resp, nil
}
