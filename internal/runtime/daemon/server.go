package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/runtime/cgroups"
	"github.com/k3sm-dev/k3sm/internal/runtime/criolog"
	"github.com/k3sm-dev/k3sm/internal/runtime/image"
	"github.com/k3sm-dev/k3sm/internal/runtime/limits"
	"github.com/k3sm-dev/k3sm/internal/runtime/pod"
	"github.com/k3sm-dev/k3sm/internal/runtime/stats"
)

// APIVersion is the contract version served.
const APIVersion = "v1"

type server struct {
	runtimev1.UnimplementedRuntimeServer
	cfg         Config
	mgr         *pod.Manager
	store       *image.Store
	log         *slog.Logger
	cloneMethod string
	netd        *netdNetwork // nil: pods share the node's network
	cgroups     *cgroups.Manager
}

// grpcErr maps lifecycle errors onto gRPC codes.
func grpcErr(err error) error {
	var ise *pod.InvalidSpecError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, pod.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.As(err, &ise):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	return status.Error(codes.Internal, err.Error())
}

func (s *server) GetRuntimeInfo(ctx context.Context, _ *runtimev1.GetRuntimeInfoRequest) (*runtimev1.GetRuntimeInfoResponse, error) {
	var uts unix.Utsname
	kernel := ""
	if unix.Uname(&uts) == nil {
		kernel = unix.ByteSliceToString(uts.Release[:])
	}
	v := s.cfg.Version
	if v == "" {
		v = "dev"
	}
	podNetwork, detail := "host", s.cfg.NoPodNetworkReason
	if s.netd != nil {
		podNetwork, detail = "netns", s.netd.configured()
	}
	return &runtimev1.GetRuntimeInfoResponse{RuntimeName: "k3sm-runtimed", RuntimeVersion: v, ApiVersion: APIVersion,
		Os: runtime.GOOS, Arch: runtime.GOARCH, KernelVersion: kernel, CpuCores: int64(runtime.NumCPU()),
		MemoryBytes: int64(memTotal()), MaxPods: s.cfg.MaxPods, BootId: s.mgr.BootID(), CloneMethod: s.cloneMethod,
		PodNetwork: podNetwork, PodNetworkDetail: detail, ResourceLimits: limits.Proto(s.cgroups.Support())}, nil
}

// UpdateRuntimeConfig passes the node's pod range on to k3sm-netd.
func (s *server) UpdateRuntimeConfig(ctx context.Context, req *runtimev1.UpdateRuntimeConfigRequest) (*runtimev1.UpdateRuntimeConfigResponse, error) {
	if s.netd == nil {
		return &runtimev1.UpdateRuntimeConfigResponse{}, nil // pods use the node's network
	}
	if _, err := netip.ParsePrefix(req.GetPodCidr()); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "pod_cidr %q: %v", req.GetPodCidr(), err)
	}
	if err := s.netd.Configure(ctx, req.GetPodCidr()); err != nil {
		return nil, status.Errorf(codes.Unavailable, "configure the pod network through k3sm-netd: %v", err)
	}
	s.log.Info("pod network configured", "podCIDR", req.GetPodCidr())
	return &runtimev1.UpdateRuntimeConfigResponse{}, nil
}

// SetPodNetworkPolicy passes a pod's resolved NetworkPolicy on to k3sm-netd.
func (s *server) SetPodNetworkPolicy(ctx context.Context, req *runtimev1.SetPodNetworkPolicyRequest) (*runtimev1.SetPodNetworkPolicyResponse, error) {
	if s.netd == nil {
		return nil, status.Error(codes.FailedPrecondition, "pods share the node's network: NetworkPolicy is not enforced")
	}
	args, err := wirePolicy(req)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := s.netd.SetPolicy(ctx, args); err != nil {
		return nil, netdStatus(err)
	}
	return &runtimev1.SetPodNetworkPolicyResponse{}, nil
}

func (s *server) CreatePod(ctx context.Context, req *runtimev1.CreatePodRequest) (*runtimev1.CreatePodResponse, error) {
	if req.GetPod() != nil {
		if n := s.mgr.Count(); int64(n) >= s.cfg.MaxPods {
			if _, err := s.mgr.Status(req.GetPod().GetUid()); err != nil {
				return nil, status.Errorf(codes.ResourceExhausted, "node runs %d pods, its capacity (MaxPods)", n)
			}
		}
	}
	st, err := s.mgr.Create(req.GetPod())
	if err != nil {
		return nil, grpcErr(err)
	}
	return &runtimev1.CreatePodResponse{Status: st}, nil
}

func (s *server) UpdatePod(ctx context.Context, req *runtimev1.UpdatePodRequest) (*runtimev1.UpdatePodResponse, error) {
	st, err := s.mgr.Update(req.GetPod())
	if err != nil {
		return nil, grpcErr(err)
	}
	return &runtimev1.UpdatePodResponse{Status: st}, nil
}

func (s *server) UpdatePodVolumes(ctx context.Context, req *runtimev1.UpdatePodVolumesRequest) (*runtimev1.UpdatePodVolumesResponse, error) {
	changed, err := s.mgr.UpdateVolumes(req.GetUid(), req.GetVolumes())
	if err != nil {
		return nil, grpcErr(err)
	}
	return &runtimev1.UpdatePodVolumesResponse{Changed: changed}, nil
}

func (s *server) DeletePod(ctx context.Context, req *runtimev1.DeletePodRequest) (*runtimev1.DeletePodResponse, error) {
	var grace *int64
	if req.GracePeriodSeconds != nil {
		g := req.GetGracePeriodSeconds()
		grace = &g
	}
	if err := s.mgr.Delete(ctx, req.GetUid(), grace, req.GetWait()); err != nil {
		return nil, grpcErr(err)
	}
	return &runtimev1.DeletePodResponse{}, nil
}

func (s *server) GetPodStatus(ctx context.Context, req *runtimev1.GetPodStatusRequest) (*runtimev1.GetPodStatusResponse, error) {
	st, err := s.mgr.Status(req.GetUid())
	if err != nil {
		return nil, grpcErr(err)
	}
	return &runtimev1.GetPodStatusResponse{Status: st}, nil
}

func (s *server) ListPods(ctx context.Context, _ *runtimev1.ListPodsRequest) (*runtimev1.ListPodsResponse, error) {
	sts, specs := s.mgr.List()
	return &runtimev1.ListPodsResponse{Pods: sts, Specs: specs}, nil
}

func (s *server) WatchPodStatus(req *runtimev1.WatchPodStatusRequest, stream runtimev1.Runtime_WatchPodStatusServer) error {
	boot := s.mgr.BootID()
	sub := s.mgr.Subscribe(req.GetEventsBootId(), req.GetEventsAfterSeq())
	defer sub.Close()
	send := func(kind runtimev1.WatchPodStatusResponse_Kind, st *runtimev1.PodStatus, ev *runtimev1.PodEvent) error {
		return stream.Send(&runtimev1.WatchPodStatusResponse{Kind: kind, Status: st, Event: ev, BootId: boot})
	}
	sts, _ := s.mgr.List()
	for _, st := range sts {
		if err := send(runtimev1.WatchPodStatusResponse_KIND_INITIAL, st, nil); err != nil {
			return err
		}
	}
	if err := send(runtimev1.WatchPodStatusResponse_KIND_SYNCED, nil, nil); err != nil {
		return err
	}
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case <-sub.C():
		}
		changed, deleted, events := sub.Take()
		for _, ev := range events {
			if err := send(runtimev1.WatchPodStatusResponse_KIND_EVENT, nil, ev); err != nil {
				return err
			}
		}
		for _, uid := range changed {
			st, err := s.mgr.Status(uid)
			if err != nil {
				continue // deleted meanwhile; reported below or next round
			}
			if err := send(runtimev1.WatchPodStatusResponse_KIND_UPDATED, st, nil); err != nil {
				return err
			}
		}
		for _, st := range deleted {
			if err := send(runtimev1.WatchPodStatusResponse_KIND_DELETED, st, nil); err != nil {
				return err
			}
		}
	}
}

func (s *server) ListPodStats(ctx context.Context, req *runtimev1.ListPodStatsRequest) (*runtimev1.ListPodStatsResponse, error) {
	_, specs := s.mgr.List()
	type ref struct {
		pod  int
		name string
		pid  int
	}
	var refs []ref
	var pgids []int
	resp := &runtimev1.ListPodStatsResponse{}
	for _, sp := range specs {
		if req.GetPodUid() != "" && sp.GetUid() != req.GetPodUid() {
			continue
		}
		resp.Pods = append(resp.Pods, &runtimev1.PodStats{Uid: sp.GetUid(), Namespace: sp.GetNamespace(), Name: sp.GetName()})
		ctrs := append(append([]*runtimev1.ContainerSpec{}, sp.GetInitContainers()...), sp.GetContainers()...)
		for _, ec := range sp.GetEphemeralContainers() {
			ctrs = append(ctrs, ec.GetContainer())
		}
		for _, c := range ctrs {
			info, err := s.mgr.Container(sp.GetUid(), c.GetName())
			if err != nil || info.Pid == 0 {
				continue
			}
			refs = append(refs, ref{len(resp.Pods) - 1, c.GetName(), info.Pid})
			pgids = append(pgids, info.Pid)
		}
	}
	if req.GetPodUid() != "" && len(resp.Pods) == 0 {
		return nil, status.Errorf(codes.NotFound, "pod %s not found", req.GetPodUid())
	}
	// The container's cgroup where it has one (every process it started,
	// working set as the kubelet counts it), else its process group: /proc
	// is read, in one pass for all, only when a reading needs it.
	var samples map[int]stats.Sample
	var err error
	scanned := false
	processGroup := func(pid int) stats.Sample {
		if !scanned {
			samples, err = stats.ProcessGroups(pgids)
			scanned = true
		}
		return samples[pid]
	}
	if s.cgroups.Version() == cgroups.None {
		if samples, err = stats.ProcessGroups(pgids); err != nil {
			return nil, status.Error(codes.Unimplemented, err.Error())
		}
		scanned = true
	}
	now := timestamppb.Now()
	for _, r := range refs {
		sm, ok := stats.Cgroup(s.cgroups, resp.Pods[r.pod].GetUid(), r.name, func() stats.Sample { return processGroup(r.pid) })
		if !ok && err != nil {
			return nil, status.Error(codes.Unimplemented, err.Error())
		}
		resp.Pods[r.pod].Containers = append(resp.Pods[r.pod].Containers, &runtimev1.ContainerStats{Name: r.name, Timestamp: now,
			CpuUsageCoreNanoseconds: sm.CPUNanos, MemoryWorkingSetBytes: sm.WorkingSetBytes, MemoryRssBytes: sm.RSSBytes, ProcessCount: sm.Processes})
	}
	return resp, nil
}

// ------------------------------------------------------------------ logs

func (s *server) GetLogs(req *runtimev1.GetLogsRequest, stream runtimev1.Runtime_GetLogsServer) error {
	info, err := s.mgr.Container(req.GetPodUid(), req.GetContainer())
	if err != nil {
		return grpcErr(err)
	}
	name := info.Spec.GetName()
	n := info.RestartCount
	if req.GetPrevious() {
		n--
		if n < 0 {
			return status.Errorf(codes.FailedPrecondition, "previous terminated container %q in pod %q not found", name, info.Pod.GetName())
		}
	}
	path := filepath.Join(info.LogDir, strconv.Itoa(int(n))+".log")
	files, err := criolog.OpenFiles(path)
	if os.IsNotExist(err) {
		st, _ := s.mgr.Status(req.GetPodUid())
		reason := "ContainerCreating"
		for _, cs := range append(st.GetInitContainerStatuses(), st.GetContainerStatuses()...) {
			if cs.GetName() != name || cs.GetState().GetWaiting() == nil {
				continue
			}
			reason = cs.GetState().GetWaiting().GetReason()
			if !req.GetPrevious() && n > 0 && cs.GetLastTerminationState().GetTerminated() != nil {
				// Waiting to start again (CrashLoopBackOff): the kubelet
				// serves the last terminated container's log, empty when
				// that attempt failed before it wrote any.
				files, err = criolog.OpenFiles(filepath.Join(info.LogDir, strconv.Itoa(int(n-1))+".log"))
				if os.IsNotExist(err) {
					return nil
				}
			}
		}
		if os.IsNotExist(err) {
			return status.Errorf(codes.FailedPrecondition, "container %q in pod %q is waiting to start: %s", name, info.Pod.GetName(), reason)
		}
	}
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	w := &logWriter{stream: stream, limit: -1, timestamps: req.GetTimestamps()}
	if req.LimitBytes != nil {
		w.limit = req.GetLimitBytes()
	}
	o := logOptions{tail: -1, follow: req.GetFollow() && !req.GetPrevious()}
	if req.GetSinceTime() != nil {
		o.since = req.GetSinceTime().AsTime()
	}
	if req.TailLines != nil {
		o.tail = req.GetTailLines()
	}
	running := func() bool { return s.mgr.AttemptRunning(req.GetPodUid(), name, n) }
	return sendLogs(stream.Context(), path, files, o, w, running)
}

type logOptions struct {
	since  time.Time
	tail   int64 // lines; -1 all
	follow bool
}

// sendLogs streams the log at path (files: its rotated files and the live
// one, as criolog.OpenFiles returns them; closed here) to w: from the start
// of the last o.tail lines (found reading backwards), through the rotated
// files into the live one, and with o.follow on into the files that replace
// it as it is rotated, until running reports the attempt ended. Nothing is
// held beyond one record and w's send buffer.
func sendLogs(ctx context.Context, path string, files []*os.File, o logOptions, w *logWriter, running func() bool) error {
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	cur := 0
	var off int64
	if o.tail >= 0 {
		var err error
		if cur, off, err = criolog.TailStart(files, o.tail); err != nil {
			return status.Error(codes.Internal, err.Error())
		}
	}
	if _, err := files[cur].Seek(off, io.SeekStart); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	r := criolog.NewReader(files[cur])
	// next reads across files: at the end of one it goes on in the next.
	next := func() (criolog.Record, error) {
		for {
			rec, err := r.Next()
			if err == io.EOF && cur < len(files)-1 {
				cur++
				r.Reset(files[cur])
				continue
			}
			return rec, err
		}
	}
	exited := false
	for {
		rec, err := next()
		if err == nil {
			if rec.Time.Before(o.since) {
				continue
			}
			if done, err := w.write(rec); done || err != nil {
				return w.flush(err)
			}
			continue
		}
		if err := w.flush(nil); err != nil || !o.follow {
			return err
		}
		// At the end of the live file: if it was rotated, finish it and go
		// on in the new one.
		if nf := criolog.Replaced(path, files[len(files)-1]); len(nf) > 0 {
			files = append(files, nf...)
			continue
		}
		if exited {
			return nil
		}
		if !running() {
			// One last pass: the shim may have written (or rotated)
			// before exiting.
			exited = true
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(100 * time.Millisecond):
		}
	}
}

type logWriter struct {
	stream     runtimev1.Runtime_GetLogsServer
	buf        []byte
	limit      int64
	sent       int64
	timestamps bool
}

// write formats one record as kubectl logs shows it; done means the byte
// limit was reached.
func (w *logWriter) write(rec criolog.Record) (bool, error) {
	start := len(w.buf)
	if w.timestamps {
		w.buf = rec.Time.UTC().AppendFormat(w.buf, time.RFC3339Nano)
		w.buf = append(w.buf, ' ')
	}
	w.buf = append(w.buf, rec.Content...)
	w.buf = append(w.buf, '\n')
	if w.limit >= 0 && w.sent+int64(len(w.buf)) >= w.limit {
		w.buf = w.buf[:max(start, int(w.limit-w.sent))]
		return true, nil
	}
	if len(w.buf) >= 32*1024 {
		return false, w.flush(nil)
	}
	return false, nil
}

func (w *logWriter) flush(err error) error {
	if err != nil {
		return err
	}
	if len(w.buf) == 0 {
		return nil
	}
	w.sent += int64(len(w.buf))
	err = w.stream.Send(&runtimev1.GetLogsResponse{Data: w.buf})
	w.buf = nil
	return err
}

// PortForward connects to the port on the pod's own loopback, inside its
// network namespace (never the host's, which would reach every loopback
// service of the node); a pod in the node's network is reached on
// 127.0.0.1.
func (s *server) PortForward(stream runtimev1.Runtime_PortForwardServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	start := first.GetStart()
	if start == nil {
		return status.Error(codes.InvalidArgument, "port-forward: the first message must carry PortForwardStart")
	}
	if start.GetPort() <= 0 || start.GetPort() > 65535 {
		return status.Errorf(codes.InvalidArgument, "port-forward: port %d is out of range", start.GetPort())
	}
	if _, err := s.mgr.Status(start.GetPodUid()); err != nil {
		return grpcErr(err)
	}
	dctx, cancel := context.WithTimeout(stream.Context(), 5*time.Second)
	conn, err := s.mgr.PortForwardDial(dctx, start.GetPodUid(), start.GetPort())
	cancel()
	if err != nil {
		return stream.Send(&runtimev1.PortForwardResponse{Msg: &runtimev1.PortForwardResponse_Error{
			Error: fmt.Sprintf("pod %s: connect to port %d: %v", start.GetPodUid(), start.GetPort(), err)}})
	}
	defer conn.Close()
	tcp := conn.(*net.TCPConn)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				tcp.CloseWrite()
				return
			}
			if m.GetCloseWrite() {
				tcp.CloseWrite()
				continue
			}
			if _, err := tcp.Write(m.GetData()); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 32*1024)
	for {
		n, err := tcp.Read(buf)
		if n > 0 {
			if serr := stream.Send(&runtimev1.PortForwardResponse{Msg: &runtimev1.PortForwardResponse_Data{Data: append([]byte(nil), buf[:n]...)}}); serr != nil {
				return serr
			}
		}
		if err != nil {
			return nil
		}
	}
}

// ---------------------------------------------------------------- images

type imagesServer struct {
	runtimev1.UnimplementedImagesServer
	store *image.Store
	// pods lists the pods the runtime runs (nil: none, as for a store
	// opened while the server is stopped).
	pods func() ([]*runtimev1.PodStatus, []*runtimev1.PodSpec)
}

func imageProto(img *image.Image) *runtimev1.Image {
	return &runtimev1.Image{Id: img.ID, RepoTags: img.RepoTags, RepoDigests: img.RepoDigests, SizeBytes: img.Size, Os: img.OS, Arch: img.Arch}
}

func (s *imagesServer) ListImages(ctx context.Context, _ *runtimev1.ListImagesRequest) (*runtimev1.ListImagesResponse, error) {
	resp := &runtimev1.ListImagesResponse{}
	used := s.usedBy()
	for _, img := range s.store.List() {
		p := imageProto(img)
		p.UsedBy = used[img.ID]
		resp.Images = append(resp.Images, p)
	}
	return resp, nil
}

func (s *imagesServer) PullImage(ctx context.Context, req *runtimev1.PullImageRequest) (*runtimev1.PullImageResponse, error) {
	img, err := s.store.Pull(ctx, req.GetImage(), req.GetPullSecrets())
	if err != nil {
		return nil, imageError(err)
	}
	return &runtimev1.PullImageResponse{Image: imageProto(img)}, nil
}

func (s *imagesServer) RemoveImage(ctx context.Context, req *runtimev1.RemoveImageRequest) (*runtimev1.RemoveImageResponse, error) {
	if err := s.store.Remove(req.GetImage()); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, status.Error(codes.NotFound, err.Error())
		}
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &runtimev1.RemoveImageResponse{}, nil
}

func (s *imagesServer) ImageFsInfo(ctx context.Context, _ *runtimev1.ImageFsInfoRequest) (*runtimev1.ImageFsInfoResponse, error) {
	fi, err := s.store.FsInfo()
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &runtimev1.ImageFsInfoResponse{Mountpoint: fi.Mountpoint, UsedBytes: fi.UsedBytes, InodesUsed: fi.InodesUsed,
		CapacityBytes: fi.Capacity, AvailableBytes: fi.Available}, nil
}
