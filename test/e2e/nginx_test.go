package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/k3sm-dev/k3sm/internal/runtime/imagetest"
)

// nginxPod is a pod of Debian's nginx (imagetest.NginxImage, pushed to a
// registry of the test's) as it comes: its master runs as the pod's root
// and binds port 80, then its workers run as www-data. Ready once a GET /
// on port 80 answers, at the pod's address as the kubelet probes.
func nginxPod(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	img, err := imagetest.NginxImage()
	if err != nil {
		t.Fatalf("Debian's nginx as an image: %v", err)
	}
	reg := imagetest.StartRegistry(t, "", "")
	p := nativePod(name, reg.Push(t, "nginx:debian", img))
	p.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 80}}
	p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{PeriodSeconds: 1,
		ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromString("http")}}}
	return p
}

// readyWithIP is a running pod with its address whose Ready condition holds.
func readyWithIP(p *corev1.Pod) error {
	if err := hasIP(p); err != nil {
		return err
	}
	if podCondition(p, corev1.PodReady) != corev1.ConditionTrue {
		return fmt.Errorf("not ready: %+v", p.Status.ContainerStatuses)
	}
	return nil
}

// getNginx GETs / on port 80 of ip, from the test's own network namespace
// (where the node's pod network is), and wants nginx's page.
func getNginx(ip string) error {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + net.JoinHostPort(ip, "80") + "/")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(body) != imagetest.NginxIndex || resp.Header.Get("Server") == "" {
		return fmt.Errorf("GET http://%s/: %s, Server %q, %q; want nginx's page", ip, resp.Status, resp.Header.Get("Server"), body)
	}
	return nil
}
