package localpath

import (
	"context"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

func TestEnsureStorageClassCreatesDefault(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	for range 2 { // idempotent
		if err := EnsureStorageClass(ctx, client); err != nil {
			t.Fatal(err)
		}
	}
	sc, err := client.StorageV1().StorageClasses().Get(ctx, StorageClassName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sc.Provisioner != ProvisionerName {
		t.Errorf("provisioner = %q", sc.Provisioner)
	}
	if ptr.Deref(sc.ReclaimPolicy, "") != corev1.PersistentVolumeReclaimDelete {
		t.Errorf("reclaimPolicy = %v", sc.ReclaimPolicy)
	}
	if ptr.Deref(sc.VolumeBindingMode, "") != storagev1.VolumeBindingWaitForFirstConsumer {
		t.Errorf("volumeBindingMode = %v", sc.VolumeBindingMode)
	}
	if sc.AllowVolumeExpansion == nil || *sc.AllowVolumeExpansion {
		t.Errorf("allowVolumeExpansion = %v", sc.AllowVolumeExpansion)
	}
	if sc.Annotations[annIsDefaultClass] != "true" {
		t.Errorf("not marked default: %v", sc.Annotations)
	}
}

func TestEnsureStorageClassNotDefaultWhenAnotherIs(t *testing.T) {
	for _, ann := range []string{annIsDefaultClass, annBetaIsDefaultClass} {
		t.Run(ann, func(t *testing.T) {
			ctx := context.Background()
			other := &storagev1.StorageClass{
				ObjectMeta:  metav1.ObjectMeta{Name: "fast", Annotations: map[string]string{ann: "true"}},
				Provisioner: "example.com/fast",
			}
			client := fake.NewClientset(other)
			if err := EnsureStorageClass(ctx, client); err != nil {
				t.Fatal(err)
			}
			sc, err := client.StorageV1().StorageClasses().Get(ctx, StorageClassName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if markedDefault(sc) {
				t.Errorf("marked default although %s is: %v", other.Name, sc.Annotations)
			}
			if sc.Provisioner != ProvisionerName {
				t.Errorf("provisioner = %q", sc.Provisioner)
			}
		})
	}
}

func TestEnsureStorageClassLeavesExisting(t *testing.T) {
	ctx := context.Background()
	mine := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: StorageClassName, Annotations: map[string]string{"note": "user edit"}},
		Provisioner:       ProvisionerName,
		ReclaimPolicy:     ptr.To(corev1.PersistentVolumeReclaimRetain),
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
	}
	client := fake.NewClientset(mine.DeepCopy())
	if err := EnsureStorageClass(ctx, client); err != nil {
		t.Fatal(err)
	}
	sc, err := client.StorageV1().StorageClasses().Get(ctx, StorageClassName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(sc, mine) {
		t.Errorf("existing class changed:\n got %+v\nwant %+v", sc, mine)
	}
	for _, a := range client.Actions() {
		if a.GetVerb() != "get" && a.GetVerb() != "list" {
			t.Errorf("unexpected write %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
}

func TestEnsureRBAC(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	if err := EnsureRBAC(ctx, client, "system:k3sm:local-path:n1"); err != nil {
		t.Fatal(err)
	}
	// A tampered role is put back; a second node's user is added, the
	// first one kept; repeating changes nothing.
	role, _ := client.RbacV1().ClusterRoles().Get(ctx, RoleName, metav1.GetOptions{})
	role.Rules = []rbacv1.PolicyRule{{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"}}}
	if _, err := client.RbacV1().ClusterRoles().Update(ctx, role, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := EnsureRBAC(ctx, client, "system:k3sm:local-path:n2"); err != nil {
			t.Fatal(err)
		}
	}
	role, err := client.RbacV1().ClusterRoles().Get(ctx, RoleName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(role.Rules, Rules()) {
		t.Errorf("rules = %+v", role.Rules)
	}
	crb, err := client.RbacV1().ClusterRoleBindings().Get(ctx, RoleName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if crb.RoleRef != (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: RoleName}) {
		t.Errorf("roleRef = %+v", crb.RoleRef)
	}
	var names []string
	for _, s := range crb.Subjects {
		if s.Kind != rbacv1.UserKind || s.APIGroup != rbacv1.GroupName {
			t.Errorf("subject %+v is not a User", s)
		}
		names = append(names, s.Name)
	}
	if want := []string{"system:k3sm:local-path:n1", "system:k3sm:local-path:n2"}; !reflect.DeepEqual(names, want) {
		t.Errorf("subjects = %v, want %v", names, want)
	}
	if err := EnsureRBAC(ctx, client, ""); err == nil {
		t.Error("empty user accepted")
	}
}

func TestRulesCoverWhatTheProvisionerCalls(t *testing.T) {
	allowed := map[string]bool{}
	for _, r := range Rules() {
		for _, res := range r.Resources {
			for _, v := range r.Verbs {
				allowed[res+"/"+v] = true
			}
		}
	}
	for _, need := range []string{
		"persistentvolumes/get", "persistentvolumes/list", "persistentvolumes/watch", "persistentvolumes/create", "persistentvolumes/delete",
		"persistentvolumeclaims/get", "persistentvolumeclaims/list", "persistentvolumeclaims/watch",
		"storageclasses/get", "events/create", "events/patch",
	} {
		if !allowed[need] {
			t.Errorf("Rules lack %s", need)
		}
	}
	if allowed["persistentvolumeclaims/update"] || allowed["persistentvolumeclaims/patch"] {
		t.Error("Rules let the provisioner write claims; it never does")
	}
}
