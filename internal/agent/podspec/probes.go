package podspec

import (
	"fmt"
	"strconv"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// probesAndHooks fills the container's probes and lifecycle hooks, with
// named ports resolved from the container's ports as the kubelet does. A
// name the container does not declare is a configuration error naming the
// field.
func probesAndHooks(c *corev1.Container, cs *runtimev1.ContainerSpec) error {
	var err error
	if cs.LivenessProbe, err = probe(c, "livenessProbe", c.LivenessProbe); err != nil {
		return err
	}
	if cs.ReadinessProbe, err = probe(c, "readinessProbe", c.ReadinessProbe); err != nil {
		return err
	}
	if cs.StartupProbe, err = probe(c, "startupProbe", c.StartupProbe); err != nil {
		return err
	}
	if c.Lifecycle == nil {
		return nil
	}
	lc := &runtimev1.Lifecycle{}
	if lc.PostStart, err = hook(c, "lifecycle.postStart", c.Lifecycle.PostStart); err != nil {
		return err
	}
	if lc.PreStop, err = hook(c, "lifecycle.preStop", c.Lifecycle.PreStop); err != nil {
		return err
	}
	if lc.PostStart != nil || lc.PreStop != nil {
		cs.Lifecycle = lc
	}
	return nil
}

func probe(c *corev1.Container, field string, p *corev1.Probe) (*runtimev1.Probe, error) {
	if p == nil {
		return nil, nil
	}
	out := &runtimev1.Probe{InitialDelaySeconds: p.InitialDelaySeconds, TimeoutSeconds: p.TimeoutSeconds,
		PeriodSeconds: p.PeriodSeconds, SuccessThreshold: p.SuccessThreshold, FailureThreshold: p.FailureThreshold}
	h := p.ProbeHandler
	switch {
	case h.Exec != nil:
		out.Handler = &runtimev1.Probe_Exec{Exec: &runtimev1.ExecAction{Command: h.Exec.Command}}
	case h.HTTPGet != nil:
		a, err := httpGet(c, field+".httpGet", h.HTTPGet)
		if err != nil {
			return nil, err
		}
		out.Handler = &runtimev1.Probe_HttpGet{HttpGet: a}
	case h.TCPSocket != nil:
		port, err := resolvePort(c, field+".tcpSocket.port", h.TCPSocket.Port)
		if err != nil {
			return nil, err
		}
		out.Handler = &runtimev1.Probe_TcpSocket{TcpSocket: &runtimev1.TCPSocketAction{Port: port, Host: h.TCPSocket.Host}}
	case h.GRPC != nil:
		g := &runtimev1.GRPCAction{Port: h.GRPC.Port}
		if h.GRPC.Service != nil {
			g.Service = *h.GRPC.Service
		}
		out.Handler = &runtimev1.Probe_Grpc{Grpc: g}
	default:
		return nil, fmt.Errorf("container %q: %s has no handler: set exec, httpGet, tcpSocket or grpc", c.Name, field)
	}
	return out, nil
}

func hook(c *corev1.Container, field string, h *corev1.LifecycleHandler) (*runtimev1.LifecycleHandler, error) {
	if h == nil {
		return nil, nil
	}
	switch {
	case h.Exec != nil:
		return &runtimev1.LifecycleHandler{Handler: &runtimev1.LifecycleHandler_Exec{Exec: &runtimev1.ExecAction{Command: h.Exec.Command}}}, nil
	case h.HTTPGet != nil:
		a, err := httpGet(c, field+".httpGet", h.HTTPGet)
		if err != nil {
			return nil, err
		}
		return &runtimev1.LifecycleHandler{Handler: &runtimev1.LifecycleHandler_HttpGet{HttpGet: a}}, nil
	case h.Sleep != nil:
		return &runtimev1.LifecycleHandler{Handler: &runtimev1.LifecycleHandler_SleepSeconds{SleepSeconds: h.Sleep.Seconds}}, nil
	case h.TCPSocket != nil:
		// Passed on so the runtime reports it as the kubelet does (an
		// unsupported handler fails the hook).
		port, _ := resolvePort(c, field+".tcpSocket.port", h.TCPSocket.Port)
		return &runtimev1.LifecycleHandler{Handler: &runtimev1.LifecycleHandler_TcpSocket{TcpSocket: &runtimev1.TCPSocketAction{Port: port, Host: h.TCPSocket.Host}}}, nil
	}
	return nil, fmt.Errorf("container %q: %s has no handler: set exec, httpGet or sleep", c.Name, field)
}

func httpGet(c *corev1.Container, field string, a *corev1.HTTPGetAction) (*runtimev1.HTTPGetAction, error) {
	port, err := resolvePort(c, field+".port", a.Port)
	if err != nil {
		return nil, err
	}
	out := &runtimev1.HTTPGetAction{Path: a.Path, Port: port, Host: a.Host, Scheme: string(a.Scheme)}
	for _, h := range a.HTTPHeaders {
		out.Headers = append(out.Headers, &runtimev1.EnvVar{Name: h.Name, Value: h.Value})
	}
	return out, nil
}

// resolvePort turns a number or a named container port into a number.
func resolvePort(c *corev1.Container, field string, p intstr.IntOrString) (int32, error) {
	if p.Type == intstr.Int {
		if p.IntVal <= 0 || p.IntVal > 65535 {
			return 0, fmt.Errorf("container %q: %s %d: must be 1-65535", c.Name, field, p.IntVal)
		}
		return p.IntVal, nil
	}
	if n, err := strconv.Atoi(p.StrVal); err == nil {
		return resolvePort(c, field, intstr.FromInt32(int32(n)))
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort, nil
		}
	}
	return 0, fmt.Errorf("container %q: %s %q: no container port has that name; add it to ports or use a number", c.Name, field, p.StrVal)
}
