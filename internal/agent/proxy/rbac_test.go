package proxy

import (
	"context"
	"reflect"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func fakeClient() *fake.Clientset { return fake.NewClientset() }

func TestEnsureRBAC(t *testing.T) {
	ctx := context.Background()
	stale := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: RoleName}, Rules: []rbacv1.PolicyRule{{Verbs: []string{"*"}}}}
	client := fake.NewClientset(stale)
	for _, user := range []string{"system:node:a", "system:node:a", "system:node:b"} {
		if err := EnsureRBAC(ctx, client, user); err != nil {
			t.Fatal(err)
		}
	}
	role, err := client.RbacV1().ClusterRoles().Get(ctx, RoleName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(role.Rules, Rules()) {
		t.Errorf("rules %v", role.Rules)
	}
	b, err := client.RbacV1().ClusterRoleBindings().Get(ctx, RoleName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if b.RoleRef.Name != RoleName || len(b.Subjects) != 2 || b.Subjects[0].Name != "system:node:a" || b.Subjects[1].Name != "system:node:b" {
		t.Errorf("binding %+v", b)
	}
	if err := EnsureRBAC(ctx, client, ""); err == nil {
		t.Error("empty user accepted")
	}
}
