package install

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/k3sm-dev/k3sm/internal/datadir"
)

// WaitReady returns an Options.Ready that waits, reporting each stage once
// and every 15 s while one lasts, until the service runs, the admin
// kubeconfig exists, the apiserver is ready, a node is Ready and a pod
// can be created in default.
func WaitReady(svc Service) func(ctx context.Context, o Options, progress func(string)) error {
	return func(ctx context.Context, o Options, progress func(string)) error {
		start := time.Now()
		stage, lastErr := "", error(nil)
		var reported time.Time
		report := func(s string) {
			if s != stage || time.Since(reported) >= 15*time.Second {
				progress(fmt.Sprintf("[%3.0fs] %s", time.Since(start).Seconds(), s))
				stage, reported = s, time.Now()
			}
		}
		for {
			s, err := readyStage(ctx, svc, o)
			if s == "" {
				if o.role() == RoleAgent {
					report("node " + o.NodeName + " joined and is Ready")
				} else {
					report("cluster is up")
				}
				return nil
			}
			lastErr = err
			report(s)
			select {
			case <-ctx.Done():
				if lastErr == nil {
					lastErr = errors.New(stage)
				}
				return fmt.Errorf("the cluster did not come up (%s): %v", stage, lastErr)
			case <-time.After(time.Second):
			}
		}
	}
}

// readyStage returns what is still awaited ("" when the cluster is up).
func readyStage(ctx context.Context, svc Service, o Options) (string, error) {
	if _, err := o.Runner.Run(ctx, svc.ActiveCommand(o)); err != nil {
		return "waiting for the service to run", err
	}
	if o.role() == RoleAgent {
		return agentReadyStage(ctx, o)
	}
	kc := datadir.New(o.DataDir).AdminKubeconfig()
	if _, err := os.Stat(kc); err != nil {
		return "service running; waiting for the server to create the cluster", err
	}
	c, err := quickClient(kc)
	if err != nil {
		return "reading the admin kubeconfig", err
	}
	if _, err := c.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx); err != nil {
		return "waiting for the apiserver", err
	}
	nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "waiting for the apiserver", err
	}
	ready := o.DisableAgent // a server without a node waits for none
	for _, n := range nodes.Items {
		for _, cond := range n.Status.Conditions {
			ready = ready || cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue
		}
	}
	if !ready {
		return "apiserver ready; waiting for the node to be Ready", nil
	}
	// Usable means a first pod is accepted: it needs these two.
	if _, err := c.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}); err != nil {
		return "node Ready; waiting for the default ServiceAccount", err
	}
	if _, err := c.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{}); err != nil {
		return "node Ready; waiting for kube-root-ca.crt", err
	}
	return "", nil
}

// agentReadyStage: the agent joined (its node credential is there) and
// its Node is Ready, read with that credential.
func agentReadyStage(ctx context.Context, o Options) (string, error) {
	l := datadir.New(o.DataDir)
	if _, err := os.Stat(l.JoinFile()); err != nil {
		return "service running; waiting for the agent to join the server", err
	}
	c, err := quickClient(l.NodeKubeconfig())
	if err != nil {
		return "joined; reading the node's kubeconfig", err
	}
	n, err := c.CoreV1().Nodes().Get(ctx, o.NodeName, metav1.GetOptions{})
	if err != nil {
		return "joined; waiting for node " + o.NodeName + " to register", err
	}
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
			return "", nil
		}
	}
	return "joined; waiting for node " + o.NodeName + " to be Ready", nil
}

// quickClient is a client of kubeconfig whose calls give up after 5 s:
// each stage is polled again a second later.
func quickClient(kubeconfig string) (kubernetes.Interface, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	rc.Timeout = 5 * time.Second
	return kubernetes.NewForConfig(rc)
}
