package cluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// E2EImage is the pinned image of the nginx smoke test (pulled through the
// docker.io mirror).
const E2EImage = "docker.io/library/nginx:1.27-alpine"

// E2EObjects are the Namespace, Deployment and LoadBalancer Service of the
// nginx smoke test.
func E2EObjects() []*unstructured.Unstructured {
	ns := "klimax-e2e"
	lbl := map[string]any{"app": "klimax-e2e-nginx"}
	return []*unstructured.Unstructured{
		{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}}},
		{Object: map[string]any{"apiVersion": "apps/v1", "kind": "Deployment",
			"metadata": map[string]any{"name": "nginx", "namespace": ns},
			"spec": map[string]any{"replicas": int64(1), "selector": map[string]any{"matchLabels": lbl},
				"template": map[string]any{"metadata": map[string]any{"labels": lbl},
					"spec": map[string]any{"containers": []any{map[string]any{"name": "nginx", "image": E2EImage,
						"ports": []any{map[string]any{"containerPort": int64(80)}}}}}}}}},
		{Object: map[string]any{"apiVersion": "v1", "kind": "Service",
			"metadata": map[string]any{"name": "nginx", "namespace": ns},
			"spec": map[string]any{"type": "LoadBalancer", "selector": lbl,
				"ports": []any{map[string]any{"port": int64(80), "targetPort": int64(80)}}}}},
	}
}

// HTTPGet fetches a URL (replaceable in tests).
type HTTPGet func(ctx context.Context, url string) (int, string, error)

func defaultGet(ctx context.Context, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, string(b), nil
}

// E2ENginx deploys nginx behind a LoadBalancer Service, waits for its
// MetalLB VIP and fetches it from this host (through the route on macOS),
// proving scheduling, image pulls via the mirror, MetalLB and routing. With
// cleanup the objects are removed afterwards.
func (m *Manager) E2ENginx(ctx context.Context, name string, cleanup bool, get HTTPGet) (string, error) {
	if get == nil {
		get = defaultGet
	}
	kc, err := m.Kubeconfig(ctx, name)
	if err != nil {
		return "", err
	}
	kube, err := m.NewKube(kc)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, SetupTimeout)
	defer cancel()
	objs := E2EObjects()
	prefix := fmt.Sprintf("[%s] ", name)
	if err := m.step(prefix+"deploy nginx ("+E2EImage+")", func() error {
		if err := kube.Apply(ctx, objs); err != nil {
			return err
		}
		return kube.WaitDeployment(ctx, "klimax-e2e", "nginx")
	}); err != nil {
		return "", err
	}
	var ip string
	if err := m.step(prefix+"wait for the LoadBalancer IP", func() error {
		ip, err = kube.LoadBalancerIP(ctx, "klimax-e2e", "nginx")
		return err
	}); err != nil {
		return "", err
	}
	url := "http://" + ip + "/"
	if err := m.step(prefix+"GET "+url, func() error {
		var last error
		for {
			code, body, err := get(ctx, url)
			if err == nil && code == http.StatusOK && strings.Contains(body, "nginx") {
				return nil
			}
			if err == nil {
				err = fmt.Errorf("HTTP %d", code)
			}
			last = err
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s not reachable from this host: %v (check `klimax doctor`: route and no-SNAT rules)", url, last)
			case <-time.After(2 * time.Second):
			}
		}
	}); err != nil {
		return ip, err
	}
	if cleanup {
		if err := m.step(prefix+"clean up", func() error {
			rev := make([]*unstructured.Unstructured, 0, len(objs))
			for i := len(objs) - 1; i >= 0; i-- {
				rev = append(rev, objs[i]) // dependents before the namespace
			}
			return kube.Delete(ctx, rev)
		}); err != nil {
			return ip, err
		}
	}
	return ip, nil
}
