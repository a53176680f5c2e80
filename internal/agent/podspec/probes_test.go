package podspec

import (
	"strings"
	"testing"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

func TestProbesAndHooksResolveNamedPorts(t *testing.T) {
	c := &corev1.Container{Name: "web", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}, {Name: "admin", ContainerPort: 9090}},
		LivenessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http"),
			Scheme: corev1.URISchemeHTTPS, HTTPHeaders: []corev1.HTTPHeader{{Name: "X-A", Value: "1"}}}},
			InitialDelaySeconds: 3, TimeoutSeconds: 2, PeriodSeconds: 5, SuccessThreshold: 1, FailureThreshold: 4},
		ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("admin"), Host: "127.0.0.2"}}},
		StartupProbe:   &corev1.Probe{ProbeHandler: corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: 7000, Service: ptr.To("svc")}}},
		Lifecycle: &corev1.Lifecycle{
			PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", "true"}}},
			PreStop:   &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 5}},
		}}
	cs := &runtimev1.ContainerSpec{}
	if err := probesAndHooks(c, cs); err != nil {
		t.Fatal(err)
	}
	lp := cs.GetLivenessProbe()
	if h := lp.GetHttpGet(); h.GetPort() != 8080 || h.GetPath() != "/healthz" || h.GetScheme() != "HTTPS" || len(h.GetHeaders()) != 1 || h.GetHeaders()[0].GetName() != "X-A" {
		t.Errorf("liveness httpGet %v", h)
	}
	if lp.GetInitialDelaySeconds() != 3 || lp.GetTimeoutSeconds() != 2 || lp.GetPeriodSeconds() != 5 || lp.GetSuccessThreshold() != 1 || lp.GetFailureThreshold() != 4 {
		t.Errorf("liveness fields %v", lp)
	}
	if tcp := cs.GetReadinessProbe().GetTcpSocket(); tcp.GetPort() != 9090 || tcp.GetHost() != "127.0.0.2" {
		t.Errorf("readiness tcp %v", tcp)
	}
	if g := cs.GetStartupProbe().GetGrpc(); g.GetPort() != 7000 || g.GetService() != "svc" {
		t.Errorf("startup grpc %v", g)
	}
	if e := cs.GetLifecycle().GetPostStart().GetExec(); len(e.GetCommand()) != 3 {
		t.Errorf("postStart %v", cs.GetLifecycle().GetPostStart())
	}
	if s := cs.GetLifecycle().GetPreStop().GetSleepSeconds(); s != 5 {
		t.Errorf("preStop sleep %d", s)
	}

	c.ReadinessProbe.TCPSocket.Port = intstr.FromString("metrics")
	err := probesAndHooks(c, &runtimev1.ContainerSpec{})
	if err == nil || !strings.Contains(err.Error(), "readinessProbe.tcpSocket.port") || !strings.Contains(err.Error(), `"metrics"`) {
		t.Errorf("unknown named port: %v", err)
	}

	none := &runtimev1.ContainerSpec{}
	if err := probesAndHooks(&corev1.Container{Name: "plain"}, none); err != nil || none.LivenessProbe != nil || none.Lifecycle != nil {
		t.Errorf("a container without probes: %v %v", err, none)
	}
}
