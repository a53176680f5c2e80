package controlplane

import (
	"context"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// fakeCluster has the upstream bootstrap roles and answers access reviews
// with decide.
func fakeCluster(t *testing.T, decide func(authorizationv1.SubjectAccessReviewSpec) bool) *fake.Clientset {
	var objs []runtime.Object
	for _, r := range requiredClusterRoles {
		objs = append(objs, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: r}})
	}
	for name, s := range requiredBindings {
		objs = append(objs, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name}, Subjects: []rbacv1.Subject{s}})
	}
	c := fake.NewSimpleClientset(objs...)
	c.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview)
		sar.Status.Allowed = decide(sar.Spec)
		return true, sar, nil
	})
	return c
}

func correct(s authorizationv1.SubjectAccessReviewSpec) bool {
	for _, c := range accessChecks {
		if c.user == s.User && c.attrs == *s.ResourceAttributes {
			return c.allowed
		}
	}
	return false
}

func TestBootstrapPassesAndCreatesBinding(t *testing.T) {
	c := fakeCluster(t, correct)
	if err := BootstrapAuthorization(context.Background(), c, nil); err != nil {
		t.Fatal(err)
	}
	b, err := c.RbacV1().ClusterRoleBindings().Get(context.Background(), KubeletAPIBinding, metav1.GetOptions{})
	if err != nil || b.RoleRef.Name != "system:kubelet-api-admin" || b.Subjects[0].Name != KubeletClientUser {
		t.Fatalf("binding %v %v", b, err)
	}
}

func TestBootstrapFailsClosed(t *testing.T) {
	t.Run("authorizer allows what must be denied", func(t *testing.T) {
		c := fakeCluster(t, func(authorizationv1.SubjectAccessReviewSpec) bool { return true })
		ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
		defer cancel()
		err := BootstrapAuthorization(ctx, c, nil)
		if err == nil || !strings.Contains(err.Error(), "refusing to serve") || !strings.Contains(err.Error(), "may not read arbitrary Secrets") {
			t.Fatalf("want a fail-closed error naming the check, got %v", err)
		}
	})
	t.Run("missing bootstrap role", func(t *testing.T) {
		c := fakeCluster(t, correct)
		_ = c.RbacV1().ClusterRoles().Delete(context.Background(), "system:node", metav1.DeleteOptions{})
		ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
		defer cancel()
		if err := BootstrapAuthorization(ctx, c, nil); err == nil || !strings.Contains(err.Error(), "system:node") {
			t.Fatalf("want an error naming the missing role, got %v", err)
		}
	})
}

func TestWaitUsable(t *testing.T) {
	client := fake.NewClientset()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	err := WaitUsable(ctx, client)
	cancel()
	if err == nil || !strings.Contains(err.Error(), "ServiceAccount default/default") {
		t.Fatalf("with nothing created: %v, want an error naming the ServiceAccount", err)
	}
	done := make(chan error, 1)
	go func() { done <- WaitUsable(context.Background(), client) }()
	bg := context.Background()
	if _, err := client.CoreV1().ServiceAccounts("default").Create(bg, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Fatalf("returned (%v) before kube-root-ca.crt exists", err)
	case <-time.After(200 * time.Millisecond):
	}
	if _, err := client.CoreV1().ConfigMaps("default").Create(bg, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("still waiting after both objects exist")
	}
}
