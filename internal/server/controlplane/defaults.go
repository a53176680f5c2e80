package controlplane

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/kubernetes/pkg/controller/certificates/rootcacertpublisher"
	"k8s.io/kubernetes/pkg/controller/serviceaccount"
)

// The server creates what a first pod in default needs itself, as soon as
// authorization is verified, instead of waiting for the controller-manager
// to reach its ServiceAccount and root-CA publisher controllers (it starts
// its ~40 controllers one after another: ~0.5 s on a fresh data dir). The
// objects are exactly what those controllers would write, so they find
// nothing to change; they stay the owners of every other namespace.

// defaultServiceAccounts are the ServiceAccounts the controller-manager's
// serviceaccounts controller ensures in every namespace.
func defaultServiceAccounts() []corev1.ServiceAccount {
	return serviceaccount.DefaultServiceAccountsControllerOptions().ServiceAccounts
}

// rootCAConfigMap is the ConfigMap the root-CA publisher creates in a
// namespace that has none, for the CA bundle rootCA.
func rootCAConfigMap(rootCA []byte) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name:        rootcacertpublisher.RootCACertConfigMapName,
			Annotations: map[string]string{rootcacertpublisher.DescriptionAnnotation: rootcacertpublisher.Description},
		},
		Data: map[string]string{"ca.crt": string(rootCA)},
	}
}

// PublishedRootCA is what the controller-manager publishes as ca.crt given
// its command line: the content of its --root-ca-file (the last one, as
// the flag parser takes it), which must hold PEM certificates. ok is false
// when no file is set (it would publish its kubeconfig's CA instead) or the
// file does not parse (it would not publish at all): the server then leaves
// the ConfigMap to the controller-manager.
func PublishedRootCA(cmArgs []string) (ca []byte, ok bool, err error) {
	file := ""
	for _, a := range cmArgs {
		if flagName(a) == "root-ca-file" {
			_, file, _ = strings.Cut(a, "=")
		}
	}
	if file == "" {
		return nil, false, nil
	}
	ca, err = os.ReadFile(file)
	if err != nil {
		return nil, false, fmt.Errorf("--root-ca-file: %w", err)
	}
	if _, err := certutil.ParseCertsPEM(ca); err != nil {
		return nil, false, fmt.Errorf("--root-ca-file %s: %w", file, err)
	}
	return ca, true, nil
}

// EnsureNamespaceDefaults creates, if absent, the default ServiceAccounts
// of namespace ns and, if rootCA is set, its kube-root-ca.crt ConfigMap.
// Objects that exist are left alone (the controllers own them). It retries
// failed creates (the namespace may not exist yet: the apiserver creates
// default shortly after it first reports ready) until ctx ends.
func EnsureNamespaceDefaults(ctx context.Context, client kubernetes.Interface, ns string, rootCA []byte) error {
	type create func() error
	var todo []create
	for _, sa := range defaultServiceAccounts() {
		todo = append(todo, func() error {
			_, err := client.CoreV1().ServiceAccounts(ns).Create(ctx, &sa, metav1.CreateOptions{})
			return err
		})
	}
	if rootCA != nil {
		todo = append(todo, func() error {
			_, err := client.CoreV1().ConfigMaps(ns).Create(ctx, rootCAConfigMap(rootCA), metav1.CreateOptions{})
			return err
		})
	}
	for _, c := range todo {
		for {
			err := c()
			if err == nil || apierrors.IsAlreadyExists(err) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("namespace %s: %w", ns, err)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}
