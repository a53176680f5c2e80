package node

import (
	"context"
	"fmt"
	"io"
	"time"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	"github.com/k3sm-dev/k3sm/internal/agent/metrics"
	dto "github.com/prometheus/client_model/go"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	"google.golang.org/protobuf/types/known/timestamppb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	utilexec "k8s.io/utils/exec"
)

func (p *Provider) uidOf(ns, name string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	uid, ok := p.byName[key(ns, name)]
	if st := p.pods[uid]; !ok || st == nil || !st.known {
		return "", errdefs.NotFoundf("pod %s/%s is not running on this node", ns, name)
	}
	return string(uid), nil
}

// GetContainerLogs streams a container's CRI log from the runtime.
func (p *Provider) GetContainerLogs(ctx context.Context, ns, name, container string, opts api.ContainerLogOpts) (io.ReadCloser, error) {
	uid, err := p.uidOf(ns, name)
	if err != nil {
		return nil, err
	}
	req := &runtimev1.GetLogsRequest{PodUid: uid, Container: container, Previous: opts.Previous, Follow: opts.Follow, Timestamps: opts.Timestamps}
	if opts.Tail > 0 {
		t := int64(opts.Tail)
		req.TailLines = &t
	}
	if opts.LimitBytes > 0 {
		l := int64(opts.LimitBytes)
		req.LimitBytes = &l
	}
	switch {
	case !opts.SinceTime.IsZero():
		req.SinceTime = timestamppb.New(opts.SinceTime)
	case opts.SinceSeconds > 0:
		req.SinceTime = timestamppb.New(time.Now().Add(-time.Duration(opts.SinceSeconds) * time.Second))
	}
	ctx, cancel := context.WithCancel(ctx)
	stream, err := p.rt.Runtime.GetLogs(ctx, req)
	if err != nil {
		cancel()
		return nil, runtimeErr(err)
	}
	// Surface "not found" style errors before any byte is written.
	first, err := stream.Recv()
	if err != nil && err != io.EOF {
		cancel()
		return nil, runtimeErr(err)
	}
	pr, pw := io.Pipe()
	go func() {
		defer cancel()
		if first != nil {
			if _, err := pw.Write(first.Data); err != nil {
				return
			}
		}
		if err == io.EOF {
			pw.Close()
			return
		}
		for {
			msg, err := stream.Recv()
			if err != nil {
				if err == io.EOF {
					err = nil
				}
				pw.CloseWithError(err)
				return
			}
			if _, err := pw.Write(msg.Data); err != nil {
				return
			}
		}
	}()
	return &cancelReader{ReadCloser: pr, cancel: cancel}, nil
}

type cancelReader struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c *cancelReader) Close() error { c.cancel(); return c.ReadCloser.Close() }

// RunInContainer runs cmd in the container's context through the runtime.
func (p *Provider) RunInContainer(ctx context.Context, ns, name, container string, cmd []string, attach api.AttachIO) error {
	uid, err := p.uidOf(ns, name)
	if err != nil {
		return err
	}
	stream, err := p.rt.Runtime.Exec(ctx)
	if err != nil {
		return err
	}
	start := &runtimev1.ExecStart{PodUid: uid, Container: container, Command: cmd, Tty: attach.TTY(), Stdin: attach.Stdin() != nil}
	if err := stream.Send(&runtimev1.ExecRequest{Msg: &runtimev1.ExecRequest_Start{Start: start}}); err != nil {
		return err
	}
	return pumpStdio(ctx, attach, false, func(b []byte) error {
		return stream.Send(&runtimev1.ExecRequest{Msg: &runtimev1.ExecRequest_Stdin{Stdin: b}})
	}, func() error {
		return stream.Send(&runtimev1.ExecRequest{Msg: &runtimev1.ExecRequest_CloseStdin{CloseStdin: true}})
	}, func(w, h uint16) error {
		return stream.Send(&runtimev1.ExecRequest{Msg: &runtimev1.ExecRequest_Resize{Resize: &runtimev1.TerminalSize{Width: uint32(w), Height: uint32(h)}}})
	}, func() (out, errb []byte, exit *runtimev1.ExitStatus, err error) {
		m, err := stream.Recv()
		if err != nil {
			return nil, nil, nil, err
		}
		return m.GetStdout(), m.GetStderr(), m.GetExit(), nil
	})
}

// AttachToContainer connects to a running container's stdio.
func (p *Provider) AttachToContainer(ctx context.Context, ns, name, container string, attach api.AttachIO) error {
	uid, err := p.uidOf(ns, name)
	if err != nil {
		return err
	}
	stream, err := p.rt.Runtime.Attach(ctx)
	if err != nil {
		return err
	}
	start := &runtimev1.AttachStart{PodUid: uid, Container: container, Tty: attach.TTY(), Stdin: attach.Stdin() != nil}
	if err := stream.Send(&runtimev1.AttachRequest{Msg: &runtimev1.AttachRequest_Start{Start: start}}); err != nil {
		return err
	}
	return pumpStdio(ctx, attach, true, func(b []byte) error {
		return stream.Send(&runtimev1.AttachRequest{Msg: &runtimev1.AttachRequest_Stdin{Stdin: b}})
	}, func() error {
		return stream.Send(&runtimev1.AttachRequest{Msg: &runtimev1.AttachRequest_CloseStdin{CloseStdin: true}})
	}, func(w, h uint16) error {
		return stream.Send(&runtimev1.AttachRequest{Msg: &runtimev1.AttachRequest_Resize{Resize: &runtimev1.TerminalSize{Width: uint32(w), Height: uint32(h)}}})
	}, func() (out, errb []byte, exit *runtimev1.ExitStatus, err error) {
		m, err := stream.Recv()
		if err != nil {
			return nil, nil, nil, err
		}
		return m.GetStdout(), m.GetStderr(), m.GetExit(), nil
	})
}

// pumpStdio copies between the kubelet API streams and a runtime stream until
// the runtime reports an exit status. For exec it becomes kubectl's exit
// code (a CodeExitError is what the remotecommand server reports as the
// exit code); an attach ends successfully when the container exits, as with
// the kubelet (kubectl reads the container's status itself when it cares).
func pumpStdio(ctx context.Context, attach api.AttachIO, isAttach bool, sendIn func([]byte) error, closeIn func() error,
	resize func(w, h uint16) error, recv func() ([]byte, []byte, *runtimev1.ExitStatus, error)) error {
	if in := attach.Stdin(); in != nil {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := in.Read(buf)
				if n > 0 && sendIn(append([]byte(nil), buf[:n]...)) != nil {
					return
				}
				if err != nil {
					_ = closeIn()
					return
				}
			}
		}()
	}
	if rs := attach.Resize(); rs != nil {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case sz, ok := <-rs:
					if !ok || resize(sz.Width, sz.Height) != nil {
						return
					}
				}
			}
		}()
	}
	for {
		out, errb, exit, err := recv()
		if err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		if len(out) > 0 && attach.Stdout() != nil {
			if _, err := attach.Stdout().Write(out); err != nil {
				return err
			}
		}
		if len(errb) > 0 && attach.Stderr() != nil {
			if _, err := attach.Stderr().Write(errb); err != nil {
				return err
			}
		}
		if exit != nil {
			if exit.GetError() != "" && !isAttach {
				// The exit status carries only the code to kubectl: say why
				// on the command's own stream, as a shell would.
				w := attach.Stderr()
				if w == nil {
					w = attach.Stdout()
				}
				if w != nil {
					fmt.Fprintf(w, "k3sm: %s\n", exit.GetError())
				}
			}
			return exitError(exit, isAttach)
		}
	}
}

// exitError turns a runtime exit status into the handler's result.
func exitError(exit *runtimev1.ExitStatus, isAttach bool) error {
	switch {
	case isAttach:
		return nil
	case exit.GetError() != "" && exit.GetExitCode() != 0:
		// The command could not be started (127: not found, 126: not
		// executable): the reason, and the code shells use for it.
		return utilexec.CodeExitError{Err: fmt.Errorf("%s: command terminated with exit code %d", exit.GetError(), exit.GetExitCode()), Code: int(exit.GetExitCode())}
	case exit.GetError() != "":
		return fmt.Errorf("%s", exit.GetError())
	case exit.GetExitCode() != 0:
		return utilexec.CodeExitError{Err: fmt.Errorf("command terminated with non-zero exit code: %d", exit.GetExitCode()), Code: int(exit.GetExitCode())}
	}
	return nil
}

// PortForward carries one connection to a port of the pod.
func (p *Provider) PortForward(ctx context.Context, ns, name string, port int32, conn io.ReadWriteCloser) error {
	defer conn.Close()
	uid, err := p.uidOf(ns, name)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := p.rt.Runtime.PortForward(ctx)
	if err != nil {
		return err
	}
	if err := stream.Send(&runtimev1.PortForwardRequest{Msg: &runtimev1.PortForwardRequest_Start{Start: &runtimev1.PortForwardStart{PodUid: uid, Port: port}}}); err != nil {
		return err
	}
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := conn.Read(buf)
			if n > 0 && stream.Send(&runtimev1.PortForwardRequest{Msg: &runtimev1.PortForwardRequest_Data{Data: append([]byte(nil), buf[:n]...)}}) != nil {
				return
			}
			if err != nil {
				_ = stream.Send(&runtimev1.PortForwardRequest{Msg: &runtimev1.PortForwardRequest_CloseWrite{CloseWrite: true}})
				return
			}
		}
	}()
	for {
		m, err := stream.Recv()
		if err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		if e := m.GetError(); e != "" {
			return fmt.Errorf("port-forward to %s/%s:%d: %s", ns, name, port, e)
		}
		if _, err := conn.Write(m.GetData()); err != nil {
			return err
		}
	}
}

// GetStatsSummary serves /stats/summary from the runtime's samples.
func (p *Provider) GetStatsSummary(ctx context.Context) (*statsv1alpha1.Summary, error) {
	resp, err := p.rt.Runtime.ListPodStats(ctx, &runtimev1.ListPodStatsRequest{})
	if err != nil {
		return nil, err
	}
	now := metav1.Now()
	sum := &statsv1alpha1.Summary{Node: statsv1alpha1.NodeStats{NodeName: p.nodeName, StartTime: now}}
	var nodeCPU, nodeMem uint64
	for _, ps := range resp.Pods {
		pod := statsv1alpha1.PodStats{PodRef: statsv1alpha1.PodReference{Name: ps.Name, Namespace: ps.Namespace, UID: ps.Uid}, StartTime: now}
		var podCPU, podMem uint64
		for _, cs := range ps.Containers {
			cpu, mem := cs.CpuUsageCoreNanoseconds, cs.MemoryWorkingSetBytes
			podCPU += cpu
			podMem += mem
			pod.Containers = append(pod.Containers, statsv1alpha1.ContainerStats{
				Name: cs.Name, StartTime: now,
				CPU:    &statsv1alpha1.CPUStats{Time: now, UsageCoreNanoSeconds: &cpu},
				Memory: &statsv1alpha1.MemoryStats{Time: now, WorkingSetBytes: &mem},
			})
		}
		pod.CPU = &statsv1alpha1.CPUStats{Time: now, UsageCoreNanoSeconds: &podCPU}
		pod.Memory = &statsv1alpha1.MemoryStats{Time: now, WorkingSetBytes: &podMem}
		nodeCPU += podCPU
		nodeMem += podMem
		sum.Pods = append(sum.Pods, pod)
	}
	sum.Node.CPU = &statsv1alpha1.CPUStats{Time: now, UsageCoreNanoSeconds: &nodeCPU}
	sum.Node.Memory = &statsv1alpha1.MemoryStats{Time: now, WorkingSetBytes: &nodeMem}
	return sum, nil
}

// GetMetricsResource serves /metrics/resource: the kubelet's resource
// metrics (node, pod and container CPU seconds and working set) from a
// fresh scrape of the runtime and the machine.
func (p *Provider) GetMetricsResource(ctx context.Context) ([]*dto.MetricFamily, error) {
	return metrics.ResourceMetrics(ctx, metrics.RuntimeSource{Runtime: p.rt.Runtime})
}
